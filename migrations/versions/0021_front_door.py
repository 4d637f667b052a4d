"""the front door: the rank-set feed's versions (`endpoint_set_versions`, one row per change of a
deployment's rank set) and each deployment's front door (`front_doors`: its URL, its keeper, the
version it applied); a job's request accounting at the front door (`reconfigurations.front_door_requests`)

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 23:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "endpoint_set_versions",
        sa.Column("deployment_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("resource_version", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=True),
        sa.Column("endpoints", sa.JSON(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("deployment_id", "resource_version"),
    )
    op.create_table(
        "front_doors",
        sa.Column("deployment_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("url", sqlmodel.sql.sqltypes.AutoString(length=512), nullable=False),
        sa.Column("keeper", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("applied_version", sa.Integer(), nullable=True),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("counters", sa.JSON(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("deployment_id"),
    )

    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("front_door_requests", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_column("front_door_requests")
    op.drop_table("front_doors")
    op.drop_table("endpoint_set_versions")
