"""vllm backend: deployments driven through an engine's own API, canary probe figures on jobs

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:00:00.000000

Deployments get `backend` (reference | vllm), the backend's settings, its secret (vLLM's API key,
never shown) and a `status_detail` that says why a deployment is degraded and what to do. Jobs get
the canary probe's `client_downtime_ms` and figures (`probe`).
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("backend", sa.String(length=16), server_default="reference", nullable=False)
        )
        batch_op.add_column(sa.Column("backend_config", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(
            sa.Column("backend_secret", sqlmodel.sql.sqltypes.AutoString(length=512), nullable=True)
        )
        batch_op.add_column(sa.Column("status_detail", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("client_downtime_ms", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("probe", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("probe")
        batch_op.drop_column("client_downtime_ms")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("status_detail")
        batch_op.drop_column("backend_secret")
        batch_op.drop_column("backend_config")
        batch_op.drop_column("backend")
