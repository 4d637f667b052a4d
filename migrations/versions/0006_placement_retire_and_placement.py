"""operator-chosen leavers and the placement record of a job

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 12:31:09.195733

`reconfigurations.retire` holds the engines a scale-down request names to leave; `placement` the
plan's old -> new rank map and what the new expert placement moves (copies, bytes, lower bound).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retire", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("placement", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("placement")
        batch_op.drop_column("retire")
