"""the job's commit (engine-agreed or the coordinator's two-step) and the downtime budget

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:31:39.267060

`reconfigurations.commit_mode`: `engines` (the coordinator arms the engines, they agree on the switch
boundary through their per-step collective) or `coordinator` (pause everywhere, then switch
everywhere). Rows written before the column ran the coordinator's commit, hence the server default.
`max_downtime_ms` on deployments (the default budget) and on jobs (the budget in force); NULL: none.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_downtime_ms", sa.Integer(), nullable=True))
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("commit_mode", sa.String(length=16), server_default="coordinator", nullable=False)
        )
        batch_op.add_column(sa.Column("max_downtime_ms", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("max_downtime_ms")
        batch_op.drop_column("commit_mode")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("max_downtime_ms")
