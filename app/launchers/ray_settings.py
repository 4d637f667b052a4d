"""A deployment's Ray settings (`launcher: ray`): where its engines run and what each one asks Ray for.

Pure data and validation, no `ray` import: the API, the database row and the CLI use it on machines
without Ray. Every engine is one detached named actor in `namespace`, pinned to one bundle of a
placement group (one group per scale-up, `placement_strategy` across its bundles).
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine_agent.protocol import Platform

# Ray's own resource names: asked for through num_cpus / num_gpus / memory_mb, not `resources`.
BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# host:port, a bare "auto", or a Ray Client URL (ray://host:port).
ADDRESS_PATTERN = r"^(auto|(ray://)?[A-Za-z0-9_.\-\[\]:]{1,250}:[0-9]{1,5})$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class PlacementStrategy(StrEnum):
    """How the engines started by one scale-up are spread over Ray nodes (Ray placement group
    strategies): PACK on as few nodes as possible, SPREAD over as many as possible; STRICT_ forms
    fail the launch rather than bend."""

    pack = "PACK"
    spread = "SPREAD"
    strict_pack = "STRICT_PACK"
    strict_spread = "STRICT_SPREAD"


class RayRuntimeEnv(BaseModel):
    """The part of Ray's `runtime_env` an engine may need on its node."""

    model_config = ConfigDict(extra="forbid")

    working_dir: str | None = Field(
        None,
        max_length=1024,
        pattern=r"^[a-z][a-z0-9+.-]*://\S+$",
        description="a remote URI (e.g. s3://bucket/code.zip, https://host/code.zip) Ray downloads to each "
        "engine's node; Ray uploads local directories for whole jobs only, not for one actor",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="environment of the actor and its agent (no secrets: Ray shows them)",
    )
    pip: list[str] | None = Field(None, max_length=64, description="packages Ray installs for the actor")

    @field_validator("env_vars")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 64:
            raise ValueError("at most 64 env_vars")
        for name, content in value.items():
            if not re.match(ENV_NAME_PATTERN, name):
                raise ValueError(f"env var name {name!r} must match {ENV_NAME_PATTERN}")
            if name.startswith("EPCTL_") or name == "RAY_ADDRESS":
                raise ValueError(f"env var {name} is set by the launcher, not by runtime_env")
            if len(content) > 4096:
                raise ValueError(f"env var {name} is longer than 4096 characters")
        return value

    @field_validator("pip")
    @classmethod
    def _pip_entries(cls, value: list[str] | None) -> list[str] | None:
        for entry in value or []:
            if not entry or len(entry) > 256 or "\x00" in entry:
                raise ValueError("each pip entry is 1-256 characters")
        return value

    def as_ray(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, exclude_defaults=True)


class RaySettings(BaseModel):
    """What `launcher: ray` needs: the cluster, the namespace of the engines' actors, and the
    resources each engine asks for."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        None,
        pattern=ADDRESS_PATTERN,
        description="the Ray cluster (host:port of the GCS, `auto`, or ray://host:port); "
        "default: the coordinator's RAY_ADDRESS, else `auto`",
    )
    namespace: str = Field(
        "epctl", pattern=NAME_PATTERN, description="the Ray namespace of the engines' named actors"
    )
    num_cpus: float = Field(1.0, ge=0, le=4096, description="CPUs reserved per engine")
    num_gpus: float = Field(0.0, ge=0, le=64, description="GPUs reserved per engine")
    memory_mb: int | None = Field(None, ge=1, le=64 * 1024 * 1024, description="memory reserved per engine")
    resources: dict[str, float] = Field(
        default_factory=dict, description='custom Ray resources per engine, e.g. {"node_type_a": 1}'
    )
    placement_strategy: PlacementStrategy = Field(
        PlacementStrategy.pack, description="placement-group strategy across the engines of one scale-up"
    )
    placement_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="how long Ray may take to find resources for a scale-up"
    )
    runtime_env: RayRuntimeEnv | None = None
    platform: Platform | None = Field(
        None,
        description="the engines' platform; default cuda when num_gpus > 0, else cpu (Ray sets "
        "CUDA_VISIBLE_DEVICES to the GPUs it reserved, so each agent uses its own)",
    )
    agent_host: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.\-:]{1,253}$",
        description="the control address agents bind and advertise; default: their Ray node's IP address",
    )
    data_interface: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.\-:@]{1,15}$",
        description="the network interface (on every node) whose address carries the agents' data plane: "
        "rendezvous store, collectives, weight channel (e.g. ib0); default: the control address",
    )

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        if len(value) > 32:
            raise ValueError("at most 32 custom resources")
        for name, amount in value.items():
            if name in BUILTIN_RESOURCES:
                raise ValueError(f"ask for {name} through num_cpus, num_gpus or memory_mb, not resources")
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"resource name {name!r} must match {NAME_PATTERN}")
            if not math.isfinite(amount) or amount <= 0 or amount > 1e6:
                raise ValueError(f"resource {name} must be a finite amount in (0, 1e6], not {amount}")
        return value

    @model_validator(mode="after")
    def _asks_for_something(self) -> RaySettings:
        # Ray refuses an empty placement-group bundle: an engine must reserve something.
        if self.num_cpus == 0 and self.num_gpus == 0 and not self.memory_mb and not self.resources:
            raise ValueError(
                "an engine must reserve some resource: num_cpus, num_gpus, memory_mb or resources"
            )
        if self.num_gpus > 1 and self.num_gpus != int(self.num_gpus):
            raise ValueError("num_gpus above 1 must be a whole number (Ray's rule)")
        return self

    def engine_platform(self) -> Platform:
        if self.platform is not None:
            return self.platform
        return Platform.cuda if self.num_gpus > 0 else Platform.cpu

    def bundle(self) -> dict[str, float]:
        """One engine's placement-group bundle, in Ray's resource names."""
        bundle: dict[str, float] = dict(self.resources)
        if self.num_cpus:
            bundle["CPU"] = self.num_cpus
        if self.num_gpus:
            bundle["GPU"] = self.num_gpus
        if self.memory_mb:
            bundle["memory"] = float(self.memory_mb * 1024 * 1024)
        return bundle
