"""conventions: a deployment's desired DP size; webhook rotation overlap and per-deployment sequence

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 12:40:00.000000

`deployments.desired_*`: the size autoscalers last asked for, who asked, why and when; the runner's
`desired-size` task acts on it once no job is active and the cooldown allows.
`webhook_subscriptions.previous_secret*`: a rotated-out secret signs too until its overlap ends.
`outbox_events.sequence` and `webhook_sequences`: every event's number within its deployment.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("desired_dp_size", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("desired_source", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True)
        )
        batch_op.add_column(
            sa.Column("desired_requester", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True)
        )
        batch_op.add_column(
            sa.Column("desired_reason", sqlmodel.sql.sqltypes.AutoString(length=1000), nullable=True)
        )
        batch_op.add_column(sa.Column("desired_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("webhook_subscriptions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("previous_secret", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True)
        )
        batch_op.add_column(
            sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True)
        )
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sequence", sa.Integer(), nullable=True))
    op.create_table(
        "webhook_sequences",
        sa.Column("deployment_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("last_sequence", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("deployment_id"),
    )


def downgrade() -> None:
    op.drop_table("webhook_sequences")
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.drop_column("sequence")
    with op.batch_alter_table("webhook_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("previous_secret_expires_at")
        batch_op.drop_column("previous_secret")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        for column in (
            "desired_at",
            "desired_reason",
            "desired_requester",
            "desired_source",
            "desired_dp_size",
        ):
            batch_op.drop_column(column)
