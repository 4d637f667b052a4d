"""stopped deployments and outages as clients saw them (issue 34)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 20:30:00

- `deployments.stopped_dp_size`: the size a deployment had when its engines were stopped (`stopped`
  status, a new value of the existing string column): what a restart brings back.
- `engines.broken_last_step_at`: when the group that broke under an engine last stepped (its report).
- `incidents.loss_evidence`, `outage_started_at`, `outage_evidence`: what an incident's loss time and
  client outage rest on (`app.deployments.incidents.outage`). An outage measured before this revision
  was the incident's own canaries' (`canaries`).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stopped_dp_size", sa.Integer(), nullable=True))
    with op.batch_alter_table("engines", schema=None) as batch_op:
        batch_op.add_column(sa.Column("broken_last_step_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("loss_evidence", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("outage_started_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("outage_evidence", sa.String(length=16), nullable=True))
    op.execute(
        sa.text("UPDATE incidents SET outage_evidence = 'canaries' WHERE client_outage_ms IS NOT NULL")
    )


def downgrade() -> None:
    # A `stopped` deployment reads as it did before this revision: ready at size 0.
    op.execute(
        sa.text("UPDATE deployments SET status = 'ready', status_detail = NULL WHERE status = 'stopped'")
    )
    with op.batch_alter_table("incidents", schema=None) as batch_op:
        batch_op.drop_column("outage_evidence")
        batch_op.drop_column("outage_started_at")
        batch_op.drop_column("loss_evidence")
    with op.batch_alter_table("engines", schema=None) as batch_op:
        batch_op.drop_column("broken_last_step_at")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_column("stopped_dp_size")
