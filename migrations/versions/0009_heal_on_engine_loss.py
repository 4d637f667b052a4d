"""heal: what a deployment does when it loses an engine

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 12:45:00.000000

Deployments get `on_engine_loss` (shrink | replace | none; NULL: the launcher's default) and
`heal_lost` and `heal_target_dp_size` (the engines a self-heal wrote off, and the size a `replace`
self-heal grows back to after shrinking).
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("on_engine_loss", sa.String(length=16), nullable=True))
        batch_op.add_column(
            sa.Column("heal_lost", sqlmodel.sql.sqltypes.AutoString(length=1000), nullable=True)
        )
        batch_op.add_column(sa.Column("heal_target_dp_size", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("heal_target_dp_size")
        batch_op.drop_column("heal_lost")
        batch_op.drop_column("on_engine_loss")
