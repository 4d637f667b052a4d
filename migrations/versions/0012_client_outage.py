"""probe: the client outage and the slowest answer, apart

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 03:00:00.000000

Jobs get `client_outage_ms` (the longest window in which canaries failed or went unanswered past their
deadline) and `client_slowest_answer_ms` (the longest latency of a canary that succeeded). The old
`client_downtime_ms` column keeps what jobs recorded before (the longest window with no successful
canary, slow answers included): it cannot be split afterwards, so it is left as it was, not copied.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("client_outage_ms", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("client_slowest_answer_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("client_slowest_answer_ms")
        batch_op.drop_column("client_outage_ms")
