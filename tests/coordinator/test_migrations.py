"""The one Alembic history builds exactly the models' schema on SQLite and on Postgres, and unwinds."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from app.core.db import alembic_config, current_revisions, head_revisions, make_engine, migrate_to_head
from app.core.tables import metadata

# The migrations themselves: on both databases.
pytestmark = pytest.mark.databases("sqlite", "postgres")


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_head_on_an_empty_database_matches_the_models(empty_database_url: str) -> None:
    migrate_to_head(empty_database_url)
    engine = make_engine(empty_database_url)
    try:
        with engine.connect() as connection:
            differences = compare_metadata(
                MigrationContext.configure(connection, opts={"compare_type": True}), metadata()
            )
        assert differences == []
        assert current_revisions(engine) == head_revisions()
    finally:
        engine.dispose()


def test_upgrade_creates_every_table_including_webhooks_and_hooks(empty_database_url: str) -> None:
    migrate_to_head(empty_database_url)
    assert set(metadata().tables) | {"alembic_version"} == _tables(empty_database_url)
    assert {
        "webhook_subscriptions",
        "outbox_events",
        "webhook_delivery_attempts",
        "inbound_hook_requests",
    } <= (_tables(empty_database_url))


def test_downgrade_base_removes_every_table(empty_database_url: str) -> None:
    migrate_to_head(empty_database_url)
    command.downgrade(alembic_config(empty_database_url), "base")
    assert _tables(empty_database_url) <= {"alembic_version"}
