"""Databases for tests, and the rule for which tests run on which.

The rule: every test that needs a database runs on SQLite (a real file). A test (or module) runs on
Postgres too only where the database's own behaviour is under test, marked
`@pytest.mark.databases("sqlite", "postgres")` (or `pytestmark = ...` for a module):
migrations; leases and claims (`FOR UPDATE`/compare-and-set races between coordinators or workers);
concurrent requests; the one-active-job index; idempotency keys; values Postgres refuses (NUL,
`DataError`); counts and pagination (ordering, cursors). One e2e case (a coordinator killed with
engines paused, reconciled after restart) runs on Postgres alone with `databases("postgres")`.
Everything else (API shapes, auth, the CLI, the dashboard, the agent) runs on SQLite only.
`EPCTL_TEST_DATABASES=sqlite,postgres` overrides the marks: every database test runs on the backends
listed (a full sweep before a release). The backend shows in the test id: `test_x[sqlite]`,
`test_x[postgres]`; `-m "not postgres"` leaves every Postgres case out.

How each is made cheap:
- SQLite: the schema is migrated once per session into a template file that each test copies.
- Postgres (database `test` at 127.0.0.1:5432, trust auth; EPCTL_TEST_POSTGRES_URL overrides): one
  migrated schema per test process (through `search_path` in the URL), emptied before each test in one
  round trip (DELETE children first, identities restarted) and rebuilt if a test left it off head.
  Measured on this machine: emptying 2-35 ms against 100-900 ms for a fresh schema per test (quiet vs
  load 15); `CREATE DATABASE ... TEMPLATE` measured 50-700 ms. Tests of the migrations themselves get an
  empty schema of their own (`empty_database_url`). Both are the real migration: Alembic's offline SQL,
  rendered once per session.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import make_url

from app.core.db import alembic_config, head_revisions, make_engine, migrate_to_head

POSTGRES_URL = os.environ.get("EPCTL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SCHEMA_PREFIX = "epctl_t_"
BACKENDS = ("sqlite", "postgres")
DATABASES_ENV = "EPCTL_TEST_DATABASES"


def backends_for(marked: Iterable[str] | None) -> list[pytest.ParameterSet]:
    """The `db_backend` parameters of one test: what its `databases` mark names (default SQLite alone),
    unless EPCTL_TEST_DATABASES names the backends for every test."""
    override = os.environ.get(DATABASES_ENV, "").strip()
    names = [n.strip() for n in override.split(",") if n.strip()] if override else list(marked or ["sqlite"])
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise pytest.UsageError(f"unknown test database {unknown}: use {', '.join(BACKENDS)}")
    return [
        pytest.param(name, id=name, marks=[pytest.mark.postgres] if name == "postgres" else [])
        for name in BACKENDS
        if name in names
    ]


def postgres_url_for_schema(schema: str, base_url: str = POSTGRES_URL) -> str:
    return (
        make_url(base_url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )


@cache
def postgres_unavailable_reason() -> str | None:
    """None when Postgres answers; tries to start the local cluster once if it does not."""
    if _postgres_answers():
        return None
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if versions and shutil.which("pg_ctlcluster"):
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if _postgres_answers():
            return None
    return f"Postgres at {make_url(POSTGRES_URL).render_as_string()} is not reachable"


def _postgres_answers() -> bool:
    engine = sa.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        return True
    except sa.exc.OperationalError:
        return False
    finally:
        engine.dispose()


@cache
def _postgres_migration_sql() -> str:
    """`alembic upgrade head --sql` for Postgres: the migration as one script."""
    config = alembic_config(POSTGRES_URL)
    buffer = io.StringIO()
    config.output_buffer = buffer
    command.upgrade(config, "head", sql=True)
    # The caller runs it inside its own transaction.
    lines = [line for line in buffer.getvalue().splitlines() if line.strip() not in ("BEGIN;", "COMMIT;")]
    return "\n".join(lines)


@cache
def _drop_schemas_of_dead_runs() -> None:
    """Schemas left by test processes that were killed before their teardown."""
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            names = connection.execute(
                sa.text("SELECT nspname FROM pg_namespace WHERE nspname LIKE :prefix"),
                {"prefix": SCHEMA_PREFIX + "%"},
            ).scalars()
            for name in list(names):
                pid = name[len(SCHEMA_PREFIX) :].split("_", 1)[0]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    finally:
        admin.dispose()


@contextlib.contextmanager
def postgres_schema(*, migrated: bool) -> Iterator[str]:
    """A fresh schema in the `test` database; yields its URL; dropped afterwards."""
    _drop_schemas_of_dead_runs()
    schema = f"{SCHEMA_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        url = postgres_url_for_schema(schema)
        if migrated:
            engine = make_engine(url)
            try:
                with engine.begin() as connection:
                    connection.exec_driver_sql(_postgres_migration_sql())
            finally:
                engine.dispose()
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text("SET lock_timeout = '10s'"))
            connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


class SharedPostgresSchema:
    """One migrated schema for a whole test process, emptied before each test that uses it."""

    def __init__(self) -> None:
        self._schema = postgres_schema(migrated=True)
        self.url = self._schema.__enter__()
        self.name = str(make_url(self.url).query["options"]).removeprefix("-csearch_path=")
        self.engine = make_engine(self.url)
        self._head = head_revisions()
        self._empty_sql = self._emptying_script()

    def _emptying_script(self) -> str:
        """One round trip: DELETE every table, children first; restart every identity."""
        reflected = sa.MetaData()
        reflected.reflect(self.engine)
        tables = [t.name for t in reversed(reflected.sorted_tables) if t.name != "alembic_version"]
        with self.engine.connect() as connection:
            sequences = connection.execute(
                sa.text("SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()")
            ).scalars()
            restarts = [f"SELECT setval('\"{name}\"', 1, false);" for name in sequences]
        # A lock a test leaked fails the next test loudly instead of hanging it.
        return (
            "SET LOCAL lock_timeout = '10s';"
            + "".join(f'DELETE FROM "{t}";' for t in tables)
            + "".join(restarts)
        )

    def reset(self) -> str:
        """Empty every table (the schema at head kept); rebuild it if a test moved it off head."""
        try:
            with self.engine.begin() as connection:
                revisions = set(
                    connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
                )
                if revisions == self._head:
                    connection.exec_driver_sql(self._empty_sql)
                    return self.url
        except sa.exc.ProgrammingError:  # no alembic_version table at all
            pass
        with self.engine.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA "{self.name}" CASCADE'))
            connection.execute(sa.text(f'CREATE SCHEMA "{self.name}"'))
            connection.exec_driver_sql(_postgres_migration_sql())
        self._empty_sql = self._emptying_script()
        return self.url

    def close(self) -> None:
        self.engine.dispose()
        self._schema.__exit__(None, None, None)


_sqlite_template: dict[str, Path] = {}


def sqlite_database(directory: Path, *, migrated: bool) -> str:
    """A fresh SQLite file in `directory`; migrated by copying a once-migrated template."""
    target = directory / f"coordinator-{uuid.uuid4().hex[:8]}.db"
    if migrated:
        template = _sqlite_template.get("path")
        if template is None:
            name = f"epctl-template-{os.getpid()}-{uuid.uuid4().hex[:6]}.db"
            template = Path(os.environ.get("TMPDIR", "/tmp")) / name
            migrate_to_head(f"sqlite:///{template}")  # its engine is disposed: the WAL is checkpointed
            _sqlite_template["path"] = template
        shutil.copyfile(template, target)
    return f"sqlite:///{target}"


@contextlib.contextmanager
def module_database(backend: str, directory: Path) -> Iterator[str]:
    """A migrated database for a group of tests (a module's coordinator): a SQLite file in `directory`
    or a Postgres schema of its own (skipped, saying why, when Postgres does not answer)."""
    if backend == "sqlite":
        yield sqlite_database(directory, migrated=True)
        return
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with postgres_schema(migrated=True) as url:
        yield url


def remove_sqlite_template() -> None:
    template = _sqlite_template.pop("path", None)
    if template is not None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{template}{suffix}").unlink(missing_ok=True)
