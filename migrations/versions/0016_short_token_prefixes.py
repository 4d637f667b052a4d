"""short token prefixes: of a token's secret at most 4 characters (after the epctl_ marker) are kept

Revision ID: 0016
Revises: 0015 (re-chained onto 0015 at merge)
Create Date: 2026-12-02 13:50:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows written before kept 12 characters of the secret; `app.tokens.models.shown_prefix` keeps 4.
    op.execute(
        sa.text(
            "UPDATE api_tokens SET token_prefix = CASE WHEN substr(token_prefix, 1, 6) = 'epctl_' "
            "THEN substr(token_prefix, 1, 10) ELSE substr(token_prefix, 1, 4) END"
        )
    )


def downgrade() -> None:
    pass  # the characters cut are gone; shorter prefixes are valid under the older code too
