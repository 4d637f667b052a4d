"""Coordinator settings, read from the environment (and an optional `.env`).

`DATABASE_URL` and `EPCTL_*` variables. Bad values stop start-up with one clear message
(`load_settings` turns pydantic's error into `ConfigError`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.targets import IPNetwork, networks
from engine_agent.tls import checked_ca_file, checked_server_pair, scheme

SQLITE_PREFIX = "sqlite://"
POSTGRES_PREFIX = "postgresql+psycopg://"


class ConfigError(RuntimeError):
    """Configuration that cannot work; the message says which setting and why."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="EPCTL_",
        env_file=".env",
        extra="ignore",
        allow_inf_nan=False,  # no inf/nan durations
    )

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
    log_format: Literal["text", "json"] = Field(
        "text", description="text, or json: one JSON object per line with job_id/engine_id/deployment"
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # TLS where traffic crosses machines (docs/operations/cluster.md#tls).
    tls_cert_file: Path | None = Field(
        None, description="serve HTTPS with this PEM certificate (chain); needs tls_key_file"
    )
    tls_key_file: Path | None = Field(None, description="the PEM private key of tls_cert_file")
    agent_ca_file: Path | None = Field(
        None,
        description="PEM CA bundle that https:// agents' certificates must chain to (default: the "
        "system's trust store); plain http:// agents are called without TLS",
    )
    auto_migrate: bool = Field(True, description="upgrade the database to head at start-up")
    db_busy_timeout_ms: int = Field(5000, ge=0, description="SQLite: how long a writer waits for the lock")
    agent_timeout_s: float = Field(5.0, gt=0, description="deadline of one coordinator -> agent call")
    heartbeat_timeout_s: float = Field(
        15.0, gt=0, description="an engine silent this long is unreachable (its deployment degraded)"
    )
    idempotency_in_flight_timeout_s: float = Field(
        60.0, gt=0, description="an Idempotency-Key still in flight after this long may be taken over"
    )
    job_lease_s: float = Field(30.0, gt=0, description="how long a coordinator's claim on a job lasts")
    # Operators' surfaces: live events, outbound webhooks, inbound autoscaler hooks.
    events_poll_s: float = Field(0.25, gt=0, description="SSE: how often a live stream polls the job log")
    webhook_worker_enabled: bool = Field(True, description="run the outbound webhook delivery worker")
    webhook_poll_s: float = Field(0.5, gt=0, description="how often the delivery worker looks for work")
    webhook_timeout_s: float = Field(10.0, gt=0, description="deadline of one delivery attempt")
    # Retries: 5 s doubling to at most 10 h, 16 attempts: about 31 h in all (Standard Webhooks suggests
    # days), each delay spread by +/- the jitter so that a fleet of failed deliveries does not stampede.
    webhook_retry_base_s: float = Field(5.0, gt=0, description="first retry delay; doubles per attempt")
    webhook_retry_max_s: float = Field(36000.0, gt=0, description="longest delay between two attempts")
    webhook_max_attempts: int = Field(16, ge=1, description="attempts before a delivery is failed")
    webhook_retry_jitter: float = Field(
        0.2, ge=0, lt=1, description="each retry delay is spread by up to this fraction either way"
    )
    webhook_ordered: bool = Field(
        True, description="one delivery in flight per subscription, oldest event first (in order)"
    )
    webhook_rotation_overlap_s: float = Field(
        86400.0, ge=0, le=30 * 86400, description="a rotated-out secret keeps signing this long"
    )
    webhook_disabled_backlog: int = Field(
        1000, ge=0, description="events queued for a disabled subscription, at most (replay fills gaps)"
    )
    webhook_claim_lease_s: float = Field(
        60.0, gt=0, description="a claimed delivery is retried by any coordinator after this long"
    )
    webhook_allow_networks: str = Field(
        "",
        description="networks (CIDRs, comma-separated) webhooks may be delivered to besides public "
        "addresses, e.g. 127.0.0.0/8,::1/128 for a receiver on this host; empty (the default): public "
        "addresses only (app/core/targets.py)",
    )
    hooks_inbound_secret: SecretStr | None = Field(
        None, description="whsec_... secret that signs generic scale requests for every deployment"
    )
    hooks_inbound_secrets: dict[str, SecretStr] = Field(
        default_factory=dict, description='per-deployment secrets, JSON: {"<deployment>": "whsec_..."}'
    )
    kube_namespace: str = Field(
        "default",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="the Kubernetes namespace the deployments appear in under /apis/epctl.io/v1 (kubectl, "
        "an aggregated API); another namespace holds none",
    )
    hooks_signature_tolerance_s: int = Field(
        300, gt=0, description="signed requests older than this are stale"
    )
    # Concurrency (helper hostile): every request's database work runs in a worker thread holding one
    # pooled connection for that call only; at most `db_request_concurrency` such calls run at once, so
    # they never wait for a connection while background workers keep the rest of the pool.
    db_pool_size: int = Field(10, ge=1, le=1000, description="database connections kept open")
    db_max_overflow: int = Field(10, ge=0, le=1000, description="extra connections opened under load")
    db_pool_timeout_s: float = Field(10.0, gt=0, description="longest wait for a free connection")
    db_request_concurrency: int = Field(
        4, ge=1, le=1000, description="request database calls running at once (the rest queue)"
    )
    auth_cache_s: float = Field(
        2.0, ge=0, description="how long a valid token is trusted without a database lookup (0: always)"
    )
    auth_failure_burst: int = Field(
        10,
        ge=0,
        le=100_000,
        description="missing or unknown tokens one client address may send before it is answered 429 "
        "(then one more per auth_failure_refill_s); a token that worked from that address keeps working; "
        "0: no limit",
    )
    auth_failure_refill_s: float = Field(1.0, gt=0, le=3600, description="see auth_failure_burst")
    endpoints_watch_max_s: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="the longest an endpoints watch waits, whatever its timeoutSeconds asks (below a proxy's "
        "idle timeout in front of the coordinator, if there is one)",
    )
    events_token_recheck_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="an open event stream checks this often that its token is still live (revoked: it ends)",
    )
    events_max_streams_per_token: int = Field(
        64, ge=1, description="SSE streams one token may hold open at once (429 beyond)"
    )
    events_max_streams: int = Field(
        4096, ge=1, description="SSE streams the coordinator holds open at once (503 beyond)"
    )
    # Input limits, checked before a body is parsed or a caller authenticated (4xx problem+json beyond).
    max_body_bytes: int = Field(1_048_576, ge=1024, description="largest request body accepted")
    max_json_depth: int = Field(32, ge=2, le=500, description="deepest nesting of a JSON body")
    max_url_bytes: int = Field(8192, ge=256, description="longest path + query string accepted")
    max_active_requests: int = Field(
        16, ge=1, description="requests processed at once; the others wait their turn (healthz never)"
    )
    max_waiting_requests: int = Field(8192, ge=1, description="requests waiting their turn (503 beyond)")
    heartbeat_shed_after_s: float = Field(
        1.0,
        ge=0,
        description="a heartbeat arriving while requests have waited longer than this is answered 503 "
        "with Retry-After at once, and its engine counted as heard (0: never shed)",
    )
    heartbeat_fast_path: bool = Field(
        True,
        description="answer steady heartbeats ahead of the API framework's routing and validation (the same "
        "answers, a fraction of the CPU); false: every heartbeat through the framework's route",
    )
    # Retention: rows older than these are pruned every `retention_interval_s`.
    retention_interval_s: float = Field(3600.0, gt=0, description="how often old records are pruned")
    retention_hook_requests_s: float = Field(
        30 * 86400.0, gt=0, description="age after which inbound hook records are pruned"
    )
    retention_webhook_deliveries_s: float = Field(
        30 * 86400.0,
        gt=0,
        description="age after which finished deliveries, their attempts and their outbox events are pruned",
    )
    retention_left_engines_s: float = Field(
        7 * 86400.0, gt=0, description="age after which engines that left are removed from the registry"
    )
    retention_jobs_s: float = Field(
        0.0,
        ge=0,
        description="age after which finished jobs and their event logs are deleted (each deployment's "
        "newest 3 kept); 0: the history is kept",
    )
    retention_idempotency_s: float = Field(
        86400.0,
        gt=0,
        description="age after which Idempotency-Key records are pruned (the key may be reused)",
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

    @field_validator("webhook_allow_networks")
    @classmethod
    def _networks(cls, text: str) -> str:
        networks(text)  # a bad CIDR stops the start, named
        return text

    @property
    def webhook_networks(self) -> tuple[IPNetwork, ...]:
        return networks(self.webhook_allow_networks)

    @field_validator("admin_token")
    @classmethod
    def _strong_admin_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < 16:
            raise ValueError("EPCTL_ADMIN_TOKEN must be at least 16 characters")
        return token

    @field_validator("hooks_inbound_secret")
    @classmethod
    def _non_empty_hook_secret(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None and not secret.get_secret_value().strip():
            raise ValueError("EPCTL_HOOKS_INBOUND_SECRET is set but empty: give a whsec_ secret or unset it")
        return secret

    @field_validator("hooks_inbound_secrets")
    @classmethod
    def _non_empty_hook_secrets(cls, secrets: dict[str, SecretStr]) -> dict[str, SecretStr]:
        empty = sorted(name for name, secret in secrets.items() if not secret.get_secret_value().strip())
        if empty:
            raise ValueError(f"EPCTL_HOOKS_INBOUND_SECRETS has an empty secret for {', '.join(empty)}")
        return secrets

    @model_validator(mode="after")
    def _loadable_tls(self) -> Settings:
        checked_server_pair(self.tls_cert_file, self.tls_key_file, "EPCTL_TLS_CERT_FILE/EPCTL_TLS_KEY_FILE")
        checked_ca_file(self.agent_ca_file, "EPCTL_AGENT_CA_FILE")
        return self

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'epctl.db'}"
        return self

    @model_validator(mode="after")
    def _consistent_limits(self) -> Settings:
        if self.db_request_concurrency >= self.db_pool_size + self.db_max_overflow:
            raise ValueError(
                f"db_request_concurrency ({self.db_request_concurrency}) must be below db_pool_size + "
                f"db_max_overflow ({self.db_pool_size + self.db_max_overflow}): background workers need "
                "connections too"
            )
        # Replay checks read the hook records of this window: keep them at least that long.
        needed = 2.0 * self.hooks_signature_tolerance_s
        if self.retention_hook_requests_s < needed:
            raise ValueError(
                f"retention_hook_requests_s ({self.retention_hook_requests_s:g}) must be at least {needed:g} "
                "(twice the signature tolerance)"
            )
        if self.retention_idempotency_s < self.idempotency_in_flight_timeout_s:
            raise ValueError("retention_idempotency_s must be at least idempotency_in_flight_timeout_s")
        return self

    @property
    def base_url(self) -> str:
        """The URL this coordinator serves at (https when it has a certificate)."""
        return f"{scheme(self.tls_cert_file)}://{self.host}:{self.port}"

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
