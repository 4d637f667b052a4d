"""The agent's settings: one validated object, from the command line or EPCTL_AGENT_* variables."""

from __future__ import annotations

import argparse
import socket
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine_agent.auth import MIN_KEY_CHARS, AgentKeys, until_epoch
from engine_agent.netif import ipv4_of
from engine_agent.protocol import MAX_PAUSE_LEASE_S, EngineConfig, Platform
from engine_agent.tls import checked_ca_file, checked_server_pair, scheme


class AgentSettings(EngineConfig, BaseSettings):
    """The engine's shape is `EngineConfig`'s fields, inherited at the top level (`EPCTL_AGENT_TOP_K`,
    `--top-k`); the rest is the agent's own."""

    model_config = SettingsConfigDict(env_prefix="EPCTL_AGENT_")

    host: str = Field("127.0.0.1", description="the control address: the HTTP API binds and advertises it")
    data_host: str | None = Field(
        None,
        description="the data address: the rendezvous store, gloo devices and the weight channel bind to "
        "it and peers use it (default: the control address)",
    )
    data_interface: str | None = Field(
        None, description="the data address as an interface (its IPv4 address), when data_host is unset"
    )
    port: int = Field(0, ge=0, le=65535, description="0: pick a free port")
    url: str | None = Field(
        None,
        description="the URL peers and the coordinator use; default http://host:port (https:// with a "
        "TLS certificate)",
    )
    tls_cert_file: str | None = Field(
        None, description="serve HTTPS with this PEM certificate (chain); needs tls_key_file"
    )
    tls_key_file: str | None = Field(None, description="the PEM private key of tls_cert_file")
    tls_ca_file: str | None = Field(
        None,
        description="PEM CA bundle the coordinator's and peers' https:// certificates must chain to "
        "(default: the system's trust store)",
    )
    engine_id: str | None = Field(None, description="default: agent-<host>-<pid>")
    platform: Platform = Platform.cpu
    device: str | None = Field(None, description="default: cpu, or cuda:0 on cuda/rocm")

    coordinator: str | None = Field(
        None,
        description="the coordinator base URL to register with; several, comma-separated, for "
        "coordinators sharing one database (the agent fails over between them)",
    )
    deployment: str | None = None
    token: str | None = None
    heartbeat_s: float = Field(3.0, gt=0)
    parent_pid: int | None = Field(
        None, description="the launcher's process: once it is gone, live only while a coordinator answers"
    )
    orphan_grace_s: float | None = Field(
        None,
        gt=0,
        description="opt-in, for throwaway machines: with --parent-pid, exit this long after the launcher "
        "is gone unless a coordinator answers; unset (the default), never exit for want of a coordinator",
    )

    enable_fault_injection: bool = Field(
        False, description="register the test-only /v1/faults route (absent otherwise: 404)"
    )
    # The keys (engine_agent/auth.py): from the environment only, never the command line (argv is
    # public): EPCTL_AGENT_KEY, EPCTL_AGENT_KEY_PREVIOUS with EPCTL_AGENT_KEY_PREVIOUS_UNTIL (during a
    # rotation), EPCTL_AGENT_DATA_KEY.
    key: SecretStr | None = Field(None, description="the deployment's agent key (control routes)")
    key_previous: SecretStr | None = Field(
        None, description="the previous agent key, during a rotation: needs key_previous_until"
    )
    key_previous_until: str | None = Field(
        None,
        description="when the previous key's overlap ends, as epoch seconds or an ISO 8601 time with a "
        "zone: it is refused from then on, on every route",
    )
    data_key: SecretStr | None = Field(None, description="required by /v1/infer when set (off by default)")
    insecure_no_agent_key: bool = Field(
        False, description="development only: serve the control routes without a key"
    )
    ready_file: str | None = None
    auth_failure_burst: int = Field(
        10,
        ge=0,
        le=100_000,
        description="wrong or missing keys one client address may send before it is answered 429 "
        "(then one more per auth_failure_refill_s); 0: no limit",
    )
    auth_failure_refill_s: float = Field(1.0, gt=0, le=3600, description="see auth_failure_burst")
    store_timeout_s: float = Field(30.0, gt=0)
    pause_lease_s: float = Field(
        10.0, gt=0, le=MAX_PAUSE_LEASE_S, description="lease after a pause caused by a peer, with no job"
    )
    torch_threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads for the serving loop. One: the reference engine's steps are "
        "small, and several engines per host each taking every core (torch's default) stall one another",
    )

    grouped_step: Literal["auto", "on", "off"] = Field(
        "auto",
        description="run a layer's experts in two batched matmuls (on), one at a time (off), or batched "
        "on a GPU only (auto: there kernel launches dominate a loop of small matmuls)",
    )

    @field_validator("cuda_graph_buckets", mode="before")
    @classmethod
    def _buckets_from_text(cls, value: object) -> object:
        """'1,8,64' as the command line and EPCTL_AGENT_CUDA_GRAPH_BUCKETS give it."""
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @model_validator(mode="after")
    def _check(self) -> AgentSettings:
        if self.platform == Platform.cpu and self.device not in (None, "cpu"):
            raise ValueError(f"platform cpu runs on device cpu, not {self.device}")
        if self.platform != Platform.cpu and self.device is not None and not self.device.startswith("cuda"):
            raise ValueError(f"platform {self.platform} needs a cuda:N device (ROCm uses the same name)")
        checked_server_pair(self.tls_cert_file, self.tls_key_file, "--tls-cert-file/--tls-key-file")
        checked_ca_file(self.tls_ca_file, "--tls-ca-file")
        for name in ("key", "key_previous", "data_key"):
            secret = getattr(self, name)
            if secret is not None and len(secret.get_secret_value().strip()) < MIN_KEY_CHARS:
                raise ValueError(f"EPCTL_AGENT_{name.upper()} must be at least {MIN_KEY_CHARS} characters")
        if self.key_previous is not None and self.key_previous_until is None:
            raise ValueError(
                "EPCTL_AGENT_KEY_PREVIOUS needs EPCTL_AGENT_KEY_PREVIOUS_UNTIL (when its overlap ends): "
                "a previous key is never accepted without an end"
            )
        if self.key_previous_until is not None:
            until_epoch(self.key_previous_until)  # a bad time stops the start, with its reason
        if self.coordinator and not self.deployment:
            raise ValueError("--coordinator needs --deployment")
        if self.cuda_graphs == "on" and (self.platform == Platform.cpu or self.grouped_step == "off"):
            raise ValueError(
                "--cuda-graphs on needs a CUDA/ROCm platform and the batched step (--grouped-step)"
            )
        return self

    @classmethod
    def from_options(cls, options: argparse.Namespace, **overrides: Any) -> AgentSettings:
        """From the command line: every option named like a setting is that setting (`overrides` win;
        a setting with no option keeps its EPCTL_AGENT_* variable or default)."""
        given = {name: value for name, value in vars(options).items() if name in cls.model_fields}
        return cls(**{**given, **overrides})

    def missing_key(self) -> str | None:
        """Why this agent must not start (no key, and not started insecure on purpose), or None."""
        if self.key is None and not self.insecure_no_agent_key:
            return (
                "no agent key: set EPCTL_AGENT_KEY (the deployment's, `epctl deployments agent-key NAME`), "
                "or start with --insecure-no-agent-key (development only: anyone who reaches the agent "
                "can then pause, abort or reconfigure it)"
            )
        return None

    def agent_keys(self) -> AgentKeys:
        def clear(secret: SecretStr | None) -> str | None:
            return secret.get_secret_value().strip() if secret is not None else None

        until = self.key_previous_until
        return AgentKeys(
            clear(self.key),
            previous=clear(self.key_previous),
            previous_until=until_epoch(until) if until is not None else None,
            data_key=clear(self.data_key),
            insecure=self.insecure_no_agent_key,
        )

    def engine_config(self) -> EngineConfig:
        return EngineConfig.model_validate(self.model_dump(include=set(EngineConfig.model_fields)))

    def coordinator_urls(self) -> list[str]:
        return [url.strip() for url in (self.coordinator or "").split(",") if url.strip()]

    def served_url(self, port: int) -> str:
        """The URL to advertise: `url`, else http(s)://host:port."""
        return self.url or f"{scheme(self.tls_cert_file)}://{self.advertised_host()}:{port}"

    def device_name(self) -> str:
        if self.device:
            return self.device
        return "cpu" if self.platform == Platform.cpu else "cuda:0"

    def advertised_host(self) -> str:
        return socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host

    def data_address(self) -> str:
        """Where the data plane binds and what peers use: `data_host`, else `data_interface`'s address,
        else the control address."""
        if self.data_host:
            return self.data_host
        if self.data_interface:
            return ipv4_of(self.data_interface)
        return self.advertised_host()

    def resolved_engine_id(self, pid: int) -> str:
        return self.engine_id or f"agent-{self.advertised_host()}-{pid}"
