"""autoscaler intents: decided once, withdrawn, stabilized, paused; /scale versions

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 02:41:02.249696

`scale_intents`: one row per distinct autoscaler ask (and per deferred `/scale` write), with its life
(pending, acted, withdrawn, superseded, ended) and the job that acted on it; it replaces the single
`deployments.desired_*` slot, which is dropped (a desired size pending at the upgrade is not carried
over: the autoscaler's next notification asks again). `inbound_hook_requests` gets the identity of a
notification (unique: copies are duplicates of one decision), the record a duplicate repeats, and the
intent a record decided about. `deployments` gets the HPA-style `autoscale_behavior`, the KEDA-style
`autoscale_paused` switch and `scale_version`, the write counter in the Scale's resourceVersion.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _text(length: int) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table(
        "scale_intents",
        sa.Column("id", _text(40), nullable=False),
        sa.Column("deployment_id", _text(40), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("stream", _text(64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("target_dp_size", sa.Integer(), nullable=False),
        sa.Column("requested_dp_size", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("anchor_dp_size", sa.Integer(), nullable=True),
        sa.Column("requester", _text(128), nullable=True),
        sa.Column("reason", _text(1000), nullable=True),
        sa.Column("request_id", _text(40), nullable=True),
        sa.Column("job_id", _text(40), nullable=True),
        sa.Column("end_code", sa.String(length=32), nullable=True),
        sa.Column("ended_by", _text(40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("scale_intents", schema=None) as batch_op:
        batch_op.create_index(
            "ix_scale_intents_deployment_ended", ["deployment_id", "ended_at"], unique=False
        )
        batch_op.create_index("ix_scale_intents_stream", ["stream", "state"], unique=False)

    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("autoscale_behavior", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(
            sa.Column("autoscale_paused", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch_op.add_column(sa.Column("scale_version", sa.Integer(), server_default="0", nullable=False))
        for column in (
            "desired_dp_size",
            "desired_source",
            "desired_requester",
            "desired_reason",
            "desired_at",
        ):
            batch_op.drop_column(column)

    with op.batch_alter_table("inbound_hook_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("identity", _text(64), nullable=True))
        batch_op.add_column(sa.Column("duplicate_of", _text(40), nullable=True))
        batch_op.add_column(sa.Column("intent_id", _text(40), nullable=True))
        batch_op.create_unique_constraint("uq_inbound_hook_requests_identity", ["identity"])


def downgrade() -> None:
    with op.batch_alter_table("inbound_hook_requests", schema=None) as batch_op:
        batch_op.drop_constraint("uq_inbound_hook_requests_identity", type_="unique")
        batch_op.drop_column("intent_id")
        batch_op.drop_column("duplicate_of")
        batch_op.drop_column("identity")

    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("desired_dp_size", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("desired_source", _text(32), nullable=True))
        batch_op.add_column(sa.Column("desired_requester", _text(128), nullable=True))
        batch_op.add_column(sa.Column("desired_reason", _text(1000), nullable=True))
        batch_op.add_column(sa.Column("desired_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.drop_column("scale_version")
        batch_op.drop_column("autoscale_paused")
        batch_op.drop_column("autoscale_behavior")

    with op.batch_alter_table("scale_intents", schema=None) as batch_op:
        batch_op.drop_index("ix_scale_intents_stream")
        batch_op.drop_index("ix_scale_intents_deployment_ended")
    op.drop_table("scale_intents")
