"""agent keys: each deployment's agent-plane key, sealed, with the previous one during a rotation

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 13:40:00.000000

"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing deployments get a key on first use (`app.deployments.agent_keys.ensure_agent_key`).
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("agent_key", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True)
        )
        batch_op.add_column(
            sa.Column("agent_key_previous", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True)
        )
        batch_op.add_column(sa.Column("agent_key_previous_until", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("agent_key_shown_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("agent_key_shown_at")
        batch_op.drop_column("agent_key_previous_until")
        batch_op.drop_column("agent_key_previous")
        batch_op.drop_column("agent_key")
