"""hook replays refused by the database; indexes for retention

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:30:00.000000

`inbound_hook_requests.webhook_id` holds a signed request's verified `webhook-id` under a unique
constraint, so two copies of one signed request can never both be recorded (the second is a replay).
Retention prunes by age: `created_at` indexes on the tables it prunes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("inbound_hook_requests", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("webhook_id", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True)
        )
        batch_op.create_unique_constraint("uq_inbound_hook_requests_webhook_id", ["webhook_id"])
        batch_op.create_index("ix_inbound_hook_requests_created_at", ["created_at"], unique=False)
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_events_created_at", ["created_at"], unique=False)
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index("ix_idempotency_keys_created_at", ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_idempotency_keys_created_at")
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_events_created_at")
    with op.batch_alter_table("inbound_hook_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_inbound_hook_requests_created_at")
        batch_op.drop_constraint("uq_inbound_hook_requests_webhook_id", type_="unique")
        batch_op.drop_column("webhook_id")
