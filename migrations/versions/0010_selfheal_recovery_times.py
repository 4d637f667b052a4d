"""selfheal: recovery figures of self-heal jobs

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 16:00:00.000000

Jobs get `loss_at`, `time_to_detect_ms` and `time_to_serving_ms` (a self-heal job's recovery figures);
deployments get `heal_loss_at` (when the loss they heal from happened, kept between the write-off and
the recovery jobs).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("loss_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("time_to_detect_ms", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("time_to_serving_ms", sa.Float(), nullable=True))
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heal_loss_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("heal_loss_at")
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("time_to_serving_ms")
        batch_op.drop_column("time_to_detect_ms")
        batch_op.drop_column("loss_at")
