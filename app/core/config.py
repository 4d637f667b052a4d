"""Coordinator settings, read from the environment (and an optional `.env`).

`DATABASE_URL` and `EPCTL_*` variables. Bad values stop start-up with one clear message
(`load_settings` turns pydantic's error into `ConfigError`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SQLITE_PREFIX = "sqlite://"
POSTGRES_PREFIX = "postgresql+psycopg://"


class ConfigError(RuntimeError):
    """Configuration that cannot work; the message says which setting and why."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPCTL_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".data"), description="where the default SQLite file lives")
    database_url: str = Field(
        "",
        validation_alias=AliasChoices("DATABASE_URL", "EPCTL_DATABASE_URL", "database_url"),
        description="sqlite:///path.db or postgresql+psycopg://user@host/db; default: <data_dir>/epctl.db",
    )
    admin_token: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("EPCTL_ADMIN_TOKEN", "admin_token"),
        description="the first admin token; generated and printed once at first start when unset",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    auto_migrate: bool = Field(True, description="upgrade the database to head at start-up")
    db_busy_timeout_ms: int = Field(5000, ge=0, description="SQLite: how long a writer waits for the lock")
    agent_timeout_s: float = Field(10.0, gt=0, description="deadline of one coordinator -> agent call")
    heartbeat_timeout_s: float = Field(15.0, gt=0, description="an engine silent this long is unreachable")
    idempotency_in_flight_timeout_s: float = Field(
        60.0, gt=0, description="an Idempotency-Key still in flight after this long may be taken over"
    )
    job_lease_s: float = Field(30.0, gt=0, description="how long a coordinator's claim on a job lasts")
    # Operators' surfaces (helper F): live events, outbound webhooks, inbound autoscaler hooks.
    events_poll_s: float = Field(0.25, gt=0, description="SSE: how often a live stream polls the job log")
    webhook_worker_enabled: bool = Field(True, description="run the outbound webhook delivery worker")
    webhook_poll_s: float = Field(0.5, gt=0, description="how often the delivery worker looks for work")
    webhook_timeout_s: float = Field(10.0, gt=0, description="deadline of one delivery attempt")
    webhook_retry_base_s: float = Field(2.0, gt=0, description="first retry delay; doubles per attempt")
    webhook_retry_max_s: float = Field(600.0, gt=0, description="longest delay between two attempts")
    webhook_max_attempts: int = Field(12, ge=1, description="attempts before a delivery is failed")
    webhook_claim_lease_s: float = Field(
        60.0, gt=0, description="a claimed delivery is retried by any coordinator after this long"
    )
    hooks_inbound_secret: SecretStr | None = Field(
        None, description="whsec_... secret that signs generic scale requests for every deployment"
    )
    hooks_inbound_secrets: dict[str, SecretStr] = Field(
        default_factory=dict, description='per-deployment secrets, JSON: {"<deployment>": "whsec_..."}'
    )
    hooks_signature_tolerance_s: int = Field(
        300, gt=0, description="signed requests older than this are stale"
    )
    hooks_dedupe_window_s: float = Field(
        86400.0, gt=0, description="how long an accepted Alertmanager notification dedupes its repeats"
    )

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, url: str) -> str:
        url = url.strip()
        if not url:
            return url
        for legacy in ("postgres://", "postgresql://"):
            if url.startswith(legacy):
                return POSTGRES_PREFIX + url[len(legacy) :]
        if url.startswith(SQLITE_PREFIX) or url.startswith(POSTGRES_PREFIX):
            return url
        raise ValueError(
            f"unsupported database URL {url.split('://')[0]!r}: use sqlite:///<file> or "
            "postgresql+psycopg://user@host:port/db"
        )

    @field_validator("admin_token")
    @classmethod
    def _strong_admin_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < 16:
            raise ValueError("EPCTL_ADMIN_TOKEN must be at least 16 characters")
        return token

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'epctl.db'}"
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith(SQLITE_PREFIX)


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, or `ConfigError` naming every bad value."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
