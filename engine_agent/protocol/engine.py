"""The engine itself: its platform, its shape (`EngineConfig`, the same on every engine of a deployment)
and the inference request."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, Self

from pydantic import BaseModel, Field, field_validator, model_validator


class Platform(StrEnum):
    cpu = "cpu"
    cuda = "cuda"
    rocm = "rocm"


class AgentState(StrEnum):
    idle = "idle"  # in no generation: a joiner before its first switch, or an engine that left
    serving = "serving"
    paused = "paused"


# As vLLM's capture sizes: powers of two up to twice the most tokens one step takes from the queue.
DEFAULT_GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MAX_GRAPH_BUCKET = 4096  # the most tokens one request may bring


def graph_buckets(buckets: list[int]) -> list[int]:
    """Graph buckets checked and in order (sorted, distinct)."""
    if not buckets or any(not 1 <= b <= MAX_GRAPH_BUCKET for b in buckets):
        raise ValueError(f"graph buckets must be 1..{MAX_GRAPH_BUCKET} tokens each, at least one")
    return sorted(set(buckets))


class EngineConfig(BaseModel):
    """The reference MoE layer. Every engine of one deployment runs the same config."""

    num_logical_experts: int = Field(16, ge=1)
    num_redundant_experts: int = Field(0, ge=0)
    hidden_size: int = Field(64, ge=1)
    intermediate_size: int = Field(128, ge=1)
    top_k: int = Field(2, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0
    num_moe_layers: int = Field(1, ge=1, le=256, description="MoE layers, each with its own experts")
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="capture the serving step as CUDA graphs, one per token-count bucket (auto: on a "
        "CUDA/ROCm device with the batched step; on: refuse to start where it cannot)",
    )
    cuda_graph_buckets: list[int] = Field(
        default_factory=lambda: list(DEFAULT_GRAPH_BUCKETS),
        min_length=1,
        max_length=32,
        description="the token counts a graph is captured for (a step is padded to the next one; "
        "past the largest it runs eagerly)",
    )

    @field_validator("cuda_graph_buckets")
    @classmethod
    def _buckets_sorted(cls, buckets: list[int]) -> list[int]:
        return graph_buckets(buckets)

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> Self:
        # A token is routed to top_k distinct logical experts: there must be that many.
        if self.top_k > self.num_logical_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must not exceed num_logical_experts ({self.num_logical_experts})"
            )
        return self

    @property
    def expert_nbytes(self) -> int:
        """One logical expert's packed weights (gate, up, down) in one layer, in bytes."""
        return 3 * self.intermediate_size * self.hidden_size * (4 if self.dtype == "float32" else 2)


class InferRequest(BaseModel):
    tokens: list[list[float]] = Field(min_length=1, description="token vectors of hidden_size")


class InferResponse(BaseModel):
    outputs: list[list[float]]
    generation: int
    rank: int
    step: int
