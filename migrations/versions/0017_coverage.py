"""coverage: the job's new placement and the deployment's serving generation, each as recorded

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 20:20:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: a job or generation from before (its coverage was not measured).
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("coverage", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("coverage", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("coverage")
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("coverage")
