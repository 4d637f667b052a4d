"""Fresh, isolated databases for tests: a file per test on SQLite, a schema per test on Postgres.

SQLite: the schema is migrated once per session into a template file, which each test copies.
Postgres (database `test` at 127.0.0.1:5432, trust auth; EPCTL_TEST_POSTGRES_URL overrides): each test
gets its own schema (through `search_path` in the URL); the migration's SQL is rendered once per
session with Alembic's offline mode and replayed into every schema. Both are the real migration.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import make_url

from app.core.db import alembic_config, make_engine, migrate_to_head

POSTGRES_URL = os.environ.get("EPCTL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SCHEMA_PREFIX = "epctl_t_"


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


def remove_sqlite_template() -> None:
    template = _sqlite_template.pop("path", None)
    if template is not None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{template}{suffix}").unlink(missing_ok=True)
