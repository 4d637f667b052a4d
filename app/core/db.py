"""The database engine, column types shared by the models, and Alembic helpers.

SQLite runs with WAL and a busy timeout so concurrent writers wait instead of failing; pysqlite opens
its transaction at the first write, so a read-then-write sequence does not hold a stale snapshot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Dialect, Engine, make_url
from sqlmodel import create_engine

from app.core import changes as _changes  # noqa: F401  (its session events count every commit's writes)
from app.core.private_files import private_sqlite_file


def _migrations_dir() -> Path:
    """The Alembic tree: `migrations/` beside `app/` in a checkout, `app/migrations` in an installed wheel
    (setup.py maps it there), so an installed coordinator migrates its own database."""
    package = Path(__file__).resolve().parent.parent
    checkout = package.parent / "migrations"
    return checkout if (checkout / "env.py").is_file() else package / "migrations"


MIGRATIONS_DIR = _migrations_dir()


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Timezone-aware UTC timestamps on every backend (SQLite stores naive values and drops the zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given where a UTC timestamp is required")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def make_engine(
    database_url: str,
    *,
    busy_timeout_ms: int = 5000,
    pool_size: int = 5,
    max_overflow: int = 10,
    pool_timeout_s: float = 30.0,
) -> Engine:
    """The engine. Pool sizes matter with concurrency: see `app.api.database.Database`, which bounds the
    request threads that use it below `pool_size + max_overflow`."""
    url = make_url(database_url)
    pool = {"pool_size": pool_size, "max_overflow": max_overflow, "pool_timeout": pool_timeout_s}
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            private_sqlite_file(Path(url.database))
        memory = not url.database or url.database == ":memory:"
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
            **({} if memory else pool),
        )

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **pool)


def alembic_config(database_url: str) -> Config:
    """Alembic configured in code (no alembic.ini needed): the migrations in the package, `database_url`,
    and the caller's logging left alone."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    # '%' is ConfigParser's interpolation character; URLs may contain it (escaped options).
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


@contextlib.contextmanager
def start_lock(database_url: str) -> Iterator[None]:
    """One coordinator at a time through start-up's writes (the migration, the first admin token): on
    Postgres a session advisory lock per schema, held on a connection of its own, so any number of
    coordinators started at once on an empty database all come up (without it, the losers died on a
    unique violation of `alembic_version`). SQLite needs none: one coordinator owns a data directory."""
    if make_url(database_url).get_backend_name() != "postgresql":
        yield
        return
    engine = make_engine(database_url, pool_size=1, max_overflow=0)
    key = sa.text("hashtext('epctl-start:' || current_schema())")
    try:
        with engine.connect() as connection:
            connection.execute(sa.select(sa.func.pg_advisory_lock(key)))
            connection.commit()
            try:
                yield
            finally:
                connection.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                connection.commit()
    finally:
        engine.dispose()


def migrate_to_head(database_url: str) -> None:
    with start_lock(database_url):
        command.upgrade(alembic_config(database_url), "head")


def head_revisions() -> set[str]:
    return set(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def current_revisions(engine: Engine) -> set[str]:
    with engine.connect() as connection:
        return set(MigrationContext.configure(connection).get_current_heads())


def schema_is_current(engine: Engine) -> bool:
    return current_revisions(engine) == head_revisions()


# Nullable JSON columns store SQL NULL for None (not the JSON literal null), so `IS NULL` means absent.
NullableJSON = sa.JSON(none_as_null=True)
