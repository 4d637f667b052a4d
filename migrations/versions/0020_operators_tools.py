"""what operators' own tools expect (issue 36): a scale intent counts the moves for it that failed or
rolled back (`attempts`) and when the next is tried (`retry_at`); an outbox event takes, at dispatch,
its place in the one order of webhook sending and replay (`dispatch_order`)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 23:10:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scale_intents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dispatch_order", sa.Integer(), nullable=True))
        batch_op.create_index("ix_outbox_events_dispatch_order", ["dispatch_order"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_events_dispatch_order")
        batch_op.drop_column("dispatch_order")
    with op.batch_alter_table("scale_intents", schema=None) as batch_op:
        batch_op.drop_column("retry_at")
        batch_op.drop_column("attempts")
