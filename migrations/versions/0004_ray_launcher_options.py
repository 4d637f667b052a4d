"""ray launcher options; requested_by wide enough for `scale-subresource`

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00.000000

`deployments.launcher_options` holds a launcher's own settings (`launcher: ray`: the Ray cluster, the
namespace and each engine's resources); NULL for local and static deployments.
`reconfigurations.requested_by` grows from 16 to 32 characters for the source `scale-subresource`.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("launcher_options", sa.JSON(none_as_null=True), nullable=True))
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.alter_column(
            "requested_by",
            existing_type=sa.String(length=16),
            type_=sa.String(length=32),
            existing_nullable=False,
        )


def downgrade() -> None:
    op.execute("UPDATE reconfigurations SET requested_by = 'api' WHERE requested_by = 'scale-subresource'")
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.alter_column(
            "requested_by",
            existing_type=sa.String(length=32),
            type_=sa.String(length=16),
            existing_nullable=False,
        )
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("launcher_options")
