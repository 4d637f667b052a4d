"""list indexes: (filter, id) for the job list's ORDER BY id DESC

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 12:30:00.000000

The single-column indexes on `state` and `requested_by` become (state, id) and (requested_by, id):
they serve every lookup the old ones did and the list's order as well.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_index("ix_reconfigurations_state")
        batch_op.drop_index("ix_reconfigurations_requested_by")
        batch_op.create_index("ix_reconfigurations_deployment_id_id", ["deployment_id", "id"], unique=False)
        batch_op.create_index(
            "ix_reconfigurations_deployment_state_id", ["deployment_id", "state", "id"], unique=False
        )
        batch_op.create_index("ix_reconfigurations_state_id", ["state", "id"], unique=False)
        batch_op.create_index("ix_reconfigurations_requested_by_id", ["requested_by", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("reconfigurations", schema=None) as batch_op:
        batch_op.drop_index("ix_reconfigurations_requested_by_id")
        batch_op.drop_index("ix_reconfigurations_state_id")
        batch_op.drop_index("ix_reconfigurations_deployment_state_id")
        batch_op.drop_index("ix_reconfigurations_deployment_id_id")
        batch_op.create_index("ix_reconfigurations_state", ["state"], unique=False)
        batch_op.create_index("ix_reconfigurations_requested_by", ["requested_by"], unique=False)
