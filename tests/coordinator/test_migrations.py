"""The one Alembic history builds exactly the models' schema on SQLite and on Postgres, and unwinds."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from app.core.config import Settings
from app.core.db import alembic_config, current_revisions, head_revisions, make_engine, migrate_to_head
from app.main import start_database
from app.tables import metadata

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


@pytest.mark.databases("postgres")
@pytest.mark.processes
def test_coordinators_starting_together_on_an_empty_postgres_all_come_up(
    empty_database_url: str, tmp_path: Path
) -> None:
    """Start-up's writes (the migration, the first admin token) run one coordinator at a time: without
    the lock the others died on a unique violation of `alembic_version` (2 of 2 in the issue). Separate
    processes, as coordinators are (Alembic's context is one per process)."""
    settings = Settings(database_url=empty_database_url, data_dir=tmp_path, admin_token=None)
    forked = multiprocessing.get_context("fork")
    gate, results = forked.Barrier(3), forked.Queue()
    starts = [forked.Process(target=_start_after, args=(settings, gate, results)) for _ in range(3)]
    for process in starts:
        process.start()
    outcomes = [results.get(timeout=120) for _ in starts]
    for process in starts:
        process.join(timeout=30)
    assert [kind for kind, _ in outcomes] == ["ok"] * 3, outcomes
    assert sum(secret is not None for _, secret in outcomes) == 1, "exactly one first admin token"
    engine = make_engine(empty_database_url)
    try:
        assert current_revisions(engine) == head_revisions()
    finally:
        engine.dispose()


def _start_after(settings: Settings, gate: Any, results: Any) -> None:
    gate.wait()
    try:
        engine, generated = start_database(settings)
        engine.dispose()
        results.put(("ok", generated))
    except Exception as exc:
        results.put(("failed", f"{type(exc).__name__}: {exc}"[:300]))


def test_0016_cuts_stored_token_prefixes_to_four_characters_of_the_secret(empty_database_url: str) -> None:
    config = alembic_config(empty_database_url)
    command.upgrade(config, "0014")
    engine = make_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            for token_id, prefix in (("tok_1", "epctl_abcdef"), ("tok_2", "0123456789ab")):
                connection.execute(
                    sa.text(
                        "INSERT INTO api_tokens (id, name, role, token_hash, token_prefix, created_at) "
                        "VALUES (:id, :id, 'admin', :id, :prefix, CURRENT_TIMESTAMP)"
                    ),
                    {"id": token_id, "prefix": prefix},
                )
        command.upgrade(config, "head")
        with engine.connect() as connection:
            rows: dict[str, str] = dict(
                connection.execute(sa.text("SELECT id, token_prefix FROM api_tokens")).all()
            )
        assert rows == {"tok_1": "epctl_abcd", "tok_2": "0123"}
    finally:
        engine.dispose()
