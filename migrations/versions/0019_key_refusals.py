"""keys that end: an engine that refuses the coordinator's agent key (`engines.key_refused_at`); webhook
delivery records keep a status and a short reason of ours, never a receiver's body; a deployment's
backend secret (vLLM's API key) is sealed, so its column holds a sealed value's length

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-08 20:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("engines", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_refused_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.alter_column(
            "backend_secret",
            existing_type=sa.String(length=512),
            type_=sa.String(length=1024),
            existing_nullable=True,
        )
    # Failed attempts recorded "HTTP 500: <the receiver's body>": keep "HTTP 500" (viewers read these).
    for table, column in (("webhook_deliveries", "last_error"), ("webhook_delivery_attempts", "error")):
        # (No LIKE pattern: the offline SQL the tests run through psycopg may hold no '%'.)
        op.execute(
            sa.text(
                f"UPDATE {table} SET {column} = substr({column}, 1, 8) "
                f"WHERE substr({column}, 1, 5) = 'HTTP ' AND substr({column}, 9, 2) = ': '"
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("engines", schema=None) as batch_op:
        batch_op.drop_column("key_refused_at")
    # (backend_secret keeps its longer column: a sealed value may not fit 512 characters.)
