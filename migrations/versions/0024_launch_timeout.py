"""launch readiness per deployment (issue 34): `deployments.launch_timeout_s`, how long a launch of its
engines waits for them to be ready; NULL: adaptive (from the launches this coordinator saw)

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 15:45:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("launch_timeout_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("launch_timeout_s")
