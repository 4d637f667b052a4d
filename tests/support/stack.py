"""Real processes for end-to-end tests, on the harness of `tests/support/processes.py`.

- `StackCoordinator`: the harness's coordinator with the job runner on and short deadlines; can be
  SIGKILLed and restarted on the same port, database and data directory (`kill()`, `start()`), and
  told to stop at a test hang point (`EPCTL_RUNNER_TEST_HANG_AT`, `wait_marker()`).
- `SteadyClient`: a thread sending one `/v1/infer` request after another to a set of engines,
  recording every success time and every failure, checking outputs against the single-process
  reference (`engine_agent.moe.reference_forward`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.probe.outage import Request, Stretch, client_outage, outage_covering
from engine_agent.protocol import EngineConfig
from tests.support.jobs import scale
from tests.support.processes import AGENT_KEY, AGENT_KEY_HEADERS, Coordinator
from tests.support.waiting import wait_until

# The small model of every e2e test: cheap on 2 cores, still a real MoE layer with real collectives.
ENGINE = EngineConfig(
    num_logical_experts=8, num_redundant_experts=0, hidden_size=32, intermediate_size=64, top_k=2
)

# Short deadlines: a failure shows in seconds, not minutes.
RUNNER_ENV = {
    "EPCTL_RUNNER_ENABLED": "true",
    "EPCTL_RUNNER_POLL_INTERVAL_S": "0.1",
    "EPCTL_RUNNER_CLEANUP_POLL_INTERVAL_S": "0.2",
    "EPCTL_RUNNER_LAUNCH_DEADLINE_S": "40",
    "EPCTL_RUNNER_PREPARE_DEADLINE_S": "30",
    "EPCTL_RUNNER_SYNC_DEADLINE_S": "10",
    "EPCTL_RUNNER_PAUSE_DEADLINE_S": "5",
    "EPCTL_RUNNER_SWITCH_DEADLINE_S": "10",
    "EPCTL_RUNNER_ABORT_DEADLINE_S": "10",
    "EPCTL_RUNNER_PAUSE_LEASE_S": "3",
    "EPCTL_RUNNER_RENDEZVOUS_S": "10",
    "EPCTL_RUNNER_COLLECTIVE_S": "10",
    "EPCTL_RUNNER_TRANSFER_S": "20",
    "EPCTL_RUNNER_LOCAL_AGENT_ARGS": "--enable-fault-injection --heartbeat-s 1",
    "EPCTL_JOB_LEASE_S": "3",
    "EPCTL_HEARTBEAT_TIMEOUT_S": "5",  # agents beat every second: a silent one shows in seconds
}


class StackCoordinator(Coordinator):
    """A coordinator that runs jobs (runner on, short deadlines) and launches local agents."""

    @property
    def marker_file(self) -> Path:
        return self.data_dir / "hang-marker"

    def environment(self, **extra: str) -> dict[str, str]:
        own = {
            **RUNNER_ENV,
            "EPCTL_RUNNER_COORDINATOR_ID": f"e2e-{self.port}",
            "EPCTL_RUNNER_TEST_MARKER_FILE": str(self.marker_file),
        }
        return super().environment(**{**own, **extra})

    def start(self, *, ready_timeout_s: float = 60.0, **env: str) -> StackCoordinator:
        self.marker_file.unlink(missing_ok=True)
        super().start(ready_timeout_s=ready_timeout_s, **env)
        return self

    def create_deployment(self, name: str = "demo", **fields: Any) -> dict[str, Any]:
        body = {
            "name": name,
            "engine": ENGINE.model_dump(),
            "min_dp_size": 1,
            "max_dp_size": 4,
            "launcher": "local",
            "agent_key": AGENT_KEY,  # the harness's, so a test may call the agents itself (`agent_http`)
            **fields,
        }
        response = self.api.post("/v1/deployments", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def request_scale(self, target: int, deployment: str = "demo", **fields: Any) -> httpx.Response:
        return self.api.post(
            "/v1/reconfigurations", json={"deployment": deployment, "target_dp_size": target, **fields}
        )

    def scale(self, target: int, deployment: str = "demo", **fields: Any) -> str:
        return scale(self.api, deployment, target, **fields)

    def wait_marker(self, timeout_s: float = 60.0) -> str:
        """The hang point the coordinator reached (it writes it to its marker file, then stops)."""
        return wait_until(
            lambda: self.marker_file.read_text() if self.marker_file.exists() else None,
            timeout_s=timeout_s,
            what="the coordinator to reach its test hang point",
            alive=self.alive,
            describe=self.log_tail,
        )

    def deployment(self, name: str = "demo") -> dict[str, Any]:
        response = self.api.get(f"/v1/deployments/{name}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def engines(self, name: str = "demo") -> list[dict[str, Any]]:
        response = self.api.get("/v1/engines", params={"deployment": name})
        assert response.status_code == 200, response.text
        return list(response.json()["data"])

    def members(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The new generation's members of a finished job, in rank order."""
        results = [r for r in job["engine_results"] if r.get("new_rank") is not None]
        return sorted(results, key=lambda r: r["new_rank"])


# Calls a test makes to the agents themselves (faults, info, reconfig): with the deployment's agent key
# (`create_deployment` gives every deployment the harness's). `/v1/infer` needs none.
agent_http = httpx.Client(headers=AGENT_KEY_HEADERS, timeout=5)


def agent_info(url: str) -> dict[str, Any]:
    return dict(agent_http.get(f"{url}/v1/info", timeout=5).json())


def infer(url: str, tokens: list[list[float]], timeout_s: float = 10.0) -> httpx.Response:
    return httpx.post(f"{url}/v1/infer", json={"tokens": tokens}, timeout=timeout_s)


# --- the steady client --------------------------------------------------------------------------------


@dataclass
class Sample:
    sent_at: float  # epoch seconds
    done_at: float
    url: str
    ok: bool
    error: str | None = None
    generation: int | None = None
    max_abs_error: float | None = None


@dataclass
class SteadyClient:
    """`streams` threads, each sending one request after another (at most `period_s` apart) to `urls`
    in turn, the whole time. Several streams keep successes dense, so the longest gap in successful
    responses measures the stop and not one request's latency."""

    urls: list[str]
    tokens: list[list[float]]
    expected: list[list[float]]
    streams: int = 4
    period_s: float = 0.004
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> SteadyClient:
        for stream in range(self.streams):
            thread = threading.Thread(target=self._run, args=(stream,), name=f"steady-{stream}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        return self.samples

    def _run(self, stream: int) -> None:
        transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        with httpx.Client(timeout=30.0, transport=transport) as http:
            i = stream
            while not self._stop.is_set():
                url = self.urls[i % len(self.urls)]
                i += 1
                sent = time.time()
                try:
                    response = http.post(f"{url}/v1/infer", json={"tokens": self.tokens})
                    done = time.time()
                    if response.status_code == 200:
                        body = response.json()
                        err = max(
                            abs(a - b)
                            for row, ref in zip(body["outputs"], self.expected, strict=True)
                            for a, b in zip(row, ref, strict=True)
                        )
                        self.samples.append(Sample(sent, done, url, True, None, body["generation"], err))
                    else:
                        error = f"{response.status_code} {response.text[:200]}"
                        self.samples.append(Sample(sent, done, url, False, error))
                except httpx.HTTPError as exc:
                    self.samples.append(Sample(sent, time.time(), url, False, f"{type(exc).__name__}: {exc}"))
                spent = time.time() - sent
                if spent < self.period_s:
                    time.sleep(self.period_s - spent)

    def wait_serving(self, count: int = 10, timeout_s: float = 30.0) -> None:
        """Until `count` more requests succeed from now on: the engines answer (again, after a commit),
        so the record has a baseline and one job's stop cannot run into the next one's."""
        since = time.time()
        wait_until(
            lambda: self.successes_between(since, float("inf")) >= count,
            timeout_s=timeout_s,
            what=f"{count} successful requests from the steady client",
            describe=lambda: f"recent failures: {self.failures()[-3:]}",
        )

    def failures(self) -> list[Sample]:
        return [s for s in self.samples if not s.ok]

    def successes_between(self, start: float, end: float) -> int:
        return sum(1 for s in list(self.samples) if s.ok and start <= s.done_at <= end)

    def latency_ms(self, quantile: float, outside_of: Sequence[tuple[float, float]] = ()) -> float:
        """A quantile of the latency of successful requests that overlap none of `outside_of`."""
        latencies = sorted(
            (s.done_at - s.sent_at) * 1000.0
            for s in self.samples
            if s.ok and not any(s.sent_at <= e and s.done_at >= b for b, e in outside_of)
        )
        return latencies[min(int(quantile * len(latencies)), len(latencies) - 1)] if latencies else 0.0

    def outage_covering(self, start: float, end: float) -> float:
        """What this client saw of one event (a kill, a commit window): `outage_covering_ms`."""
        return outage_covering_ms(list(self.samples), start, end)

    def outage_within(self, start: float, end: float) -> Stretch | None:
        """The longest stretch with no successful answer within [start, end] (a job's span), clipped."""
        return client_outage(list(self.samples), start=start, end=end)


def outage_covering_ms(samples: Sequence[Request], start: float, end: float) -> float:
    """The longest stretch with no successful answer (ms; the one rule, `app.probe.outage`) that
    overlaps [start, end], whole, in a client's recording, which ends at its last answer (0: none).
    Shared with the benchmarks' steady client (`benchmarks/downtime.py`)."""
    until = max((s.done_at for s in samples if s.done_at is not None), default=end)
    found = outage_covering(samples, start=start, end=end, until=until)
    return found.ms if found else 0.0


def failures_around(samples: list[Sample], fault_at: float, served_again_at: float, what: str) -> None:
    """Every failed request was in flight at the fault or sent after it, before the survivors served
    again; none after."""
    failures = [s for s in samples if not s.ok]
    print(f"front door through {what}: {len(samples)} requests, {len(failures)} failed")
    if failures:
        first, last = min(f.sent_at for f in failures), max(f.done_at for f in failures)
        print(f"  failures from {first - fault_at:+.3f} s to {last - fault_at:+.3f} s after the fault")
        print(f"  errors: {sorted({str(f.error)[:80] for f in failures})[:4]}")
    assert all(fault_at <= f.done_at and f.sent_at <= served_again_at for f in failures), failures
    assert not [s for s in samples if not s.ok and s.sent_at > served_again_at]
