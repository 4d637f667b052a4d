"""partial growth (issue 38): a job may commit part of a grow (`reconfigurations.reached_dp_size`, the
size it reached; the rest stands as the deployment's target) unless it asked for all or nothing
(`reconfigurations.all_or_nothing`)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 02:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("all_or_nothing", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("reached_dp_size", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("reached_dp_size")
        batch_op.drop_column("all_or_nothing")
