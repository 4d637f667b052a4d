"""Real Prometheus and Alertmanager processes (Debian's packages, installed by scripts/prometheus-tools),
each on a free loopback port with its own config and storage in a temporary directory, for the tests
that check the coordinator against the clients operators run. `missing()` says which binary is absent
(the tests skip with that reason)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import httpx

from tests.support.processes import Child, clean_environment, free_port, spawn

ALERTMANAGER = "prometheus-alertmanager"
PROMETHEUS = "prometheus"


def missing(*binaries: str) -> str | None:
    """The reason to skip when a binary is not installed, else None."""
    absent = [name for name in binaries if shutil.which(name) is None]
    if not absent:
        return None
    return f"{', '.join(absent)} not installed: scripts/prometheus-tools installs Debian's packages (as root)"


@dataclass
class Monitor:
    """One Prometheus or Alertmanager process; `start()` waits until its readiness endpoint answers."""

    binary: str
    config: str
    directory: Path
    port: int = field(default_factory=free_port)
    child: Child | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.directory / f"{self.binary}.log"

    def argv(self, config_file: Path) -> list[str]:
        listen = f"--web.listen-address=127.0.0.1:{self.port}"
        if self.binary == ALERTMANAGER:
            storage = f"--storage.path={self.directory / 'data'}"
            # No gossip cluster: one Alertmanager on loopback, nothing else to peer with.
            no_cluster = "--cluster.listen-address="
            return [
                ALERTMANAGER,
                f"--config.file={config_file}",
                storage,
                listen,
                no_cluster,
                "--log.level=debug",
            ]
        storage = f"--storage.tsdb.path={self.directory / 'data'}"
        return [PROMETHEUS, f"--config.file={config_file}", storage, listen, "--log.level=debug"]

    def start(self, timeout_s: float = 60.0) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        config_file = self.directory / "config.yml"
        config_file.write_text(self.config)
        self.child = spawn(self.binary, self.argv(config_file), self.log_file, env=clean_environment())
        self.child.wait_for(
            lambda: httpx.get(f"{self.url}/-/ready", timeout=2.0).status_code == 200,
            timeout_s=timeout_s,
            what=f"{self.binary} on {self.url} to be ready",
        )
        return self

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fire(alertmanager: Monitor, labels: dict[str, str], annotations: dict[str, str] | None = None) -> None:
    """Post one firing alert to Alertmanager's API, as Prometheus' rule evaluation would."""
    alert = {"labels": labels, "annotations": annotations or {}, "startsAt": datetime.now(UTC).isoformat()}
    response = httpx.post(f"{alertmanager.url}/api/v2/alerts", json=[alert], timeout=10.0)
    response.raise_for_status()


def resolve(alertmanager: Monitor, labels: dict[str, str]) -> None:
    """End a firing alert, as Prometheus does when its rule stops matching (endsAt now)."""
    ended = {"labels": labels, "endsAt": datetime.now(UTC).isoformat()}
    response = httpx.post(f"{alertmanager.url}/api/v2/alerts", json=[ended], timeout=10.0)
    response.raise_for_status()


def prometheus_query(prometheus: Monitor, query: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus.url}/api/v1/query", params={"query": query}, timeout=10.0)
    response.raise_for_status()
    return list(response.json()["data"]["result"])


def active_targets(prometheus: Monitor) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus.url}/api/v1/targets", params={"state": "active"}, timeout=10.0)
    response.raise_for_status()
    return list(response.json()["data"]["activeTargets"])
