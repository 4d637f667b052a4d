"""The agent's settings: one validated object, from the command line or EPCTL_AGENT_* variables."""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine_agent.protocol import DEFAULT_GRAPH_BUCKETS, EngineConfig, Platform, graph_buckets


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPCTL_AGENT_")

    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0: pick a free port")
    url: str | None = Field(
        None, description="the URL peers and the coordinator use; default http://host:port"
    )
    engine_id: str | None = Field(None, description="default: agent-<host>-<pid>")
    platform: Platform = Platform.cpu
    device: str | None = Field(None, description="default: cpu, or cuda:0 on cuda/rocm")

    num_logical_experts: int = Field(16, ge=1)
    num_redundant_experts: int = Field(0, ge=0)
    hidden_size: int = Field(64, ge=1)
    intermediate_size: int = Field(128, ge=1)
    top_k: int = Field(2, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0
    num_moe_layers: int = Field(1, ge=1, le=256)

    coordinator: str | None = Field(None, description="coordinator base URL to register with")
    deployment: str | None = None
    token: str | None = None
    heartbeat_s: float = Field(3.0, gt=0)
    parent_pid: int | None = Field(
        None, description="the launcher's process: once it is gone, live only while a coordinator answers"
    )
    orphan_grace_s: float = Field(
        15.0, gt=0, description="how long an orphan waits for a coordinator to adopt it before it exits"
    )

    enable_fault_injection: bool = False
    ready_file: str | None = None
    store_timeout_s: float = Field(30.0, gt=0)
    pause_lease_s: float = Field(10.0, gt=0, description="lease after a pause caused by a peer, with no job")
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

    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="capture the step as CUDA graphs per token-count bucket (auto: on CUDA/ROCm with the "
        "batched step; on: refuse to start where the step cannot be captured)",
    )
    cuda_graph_buckets: list[int] = Field(
        default_factory=lambda: list(DEFAULT_GRAPH_BUCKETS),
        description="token counts with a graph, e.g. 1,8,64 (a step is padded to the next; past the "
        "largest it runs eagerly)",
    )

    @field_validator("cuda_graph_buckets", mode="before")
    @classmethod
    def _buckets_from_text(cls, value: object) -> object:
        """'1,8,64' as the command line and EPCTL_AGENT_CUDA_GRAPH_BUCKETS give it."""
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("cuda_graph_buckets")
    @classmethod
    def _buckets_in_bounds(cls, buckets: list[int]) -> list[int]:
        return graph_buckets(buckets)

    @model_validator(mode="after")
    def _check(self) -> AgentSettings:
        if self.platform == Platform.cpu and self.device not in (None, "cpu"):
            raise ValueError(f"platform cpu runs on device cpu, not {self.device}")
        if self.platform != Platform.cpu and self.device is not None and not self.device.startswith("cuda"):
            raise ValueError(f"platform {self.platform} needs a cuda:N device (ROCm uses the same name)")
        if self.coordinator and not self.deployment:
            raise ValueError("--coordinator needs --deployment")
        if self.cuda_graphs == "on" and (self.platform == Platform.cpu or self.grouped_step == "off"):
            raise ValueError(
                "--cuda-graphs on needs a CUDA/ROCm platform and the batched step (--grouped-step)"
            )
        return self

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            num_logical_experts=self.num_logical_experts,
            num_redundant_experts=self.num_redundant_experts,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            top_k=self.top_k,
            dtype=self.dtype,
            seed=self.seed,
            num_moe_layers=self.num_moe_layers,
            cuda_graphs=self.cuda_graphs,
            cuda_graph_buckets=self.cuda_graph_buckets,
        )

    def device_name(self) -> str:
        if self.device:
            return self.device
        return "cpu" if self.platform == Platform.cpu else "cuda:0"

    def advertised_host(self) -> str:
        return socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host

    def resolved_engine_id(self, pid: int) -> str:
        return self.engine_id or f"agent-{self.advertised_host()}-{pid}"
