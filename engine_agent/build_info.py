"""`epctl_build_info`: which build a process runs, for the coordinator's and every agent's `/metrics`
(torch-free: both import it). With the process and platform collectors of `prometheus_client`
(`process_*` series: CPU, memory, open files, start time; `python_info`) on the same registry."""

from __future__ import annotations

import importlib.metadata
import platform

from prometheus_client import CollectorRegistry, Gauge, PlatformCollector, ProcessCollector

DISTRIBUTION = "elastic-ep-control"


def version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def register(registry: CollectorRegistry, component: str) -> None:
    """Add the process, platform and build-info collectors to `registry` (once per registry)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    info = Gauge(
        "epctl_build_info",
        "Always 1; the labels name the build this process runs.",
        ["version", "component", "python_version"],
        registry=registry,
    )
    info.labels(version=version(), component=component, python_version=platform.python_version()).set(1)
