"""A small fleet under load keeps its invariants (issue 37): 64 lightweight engines in 8 deployments
heartbeating every 2 s, one job on every deployment at once (each forms its generation of 5 or 6
engines), an SSE client on each job. Every heartbeat is recorded (answered 200 once committed; none
refused, none forgotten), every job ends succeeded with a gapless log, no heartbeating engine is ever
shown lost, and every SSE stream carries every event of its job, in order. `benchmarks/fleet.py`
measures the same at 128-2,048 engines."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine_agent.protocol import EngineConfig, key_check
from tests.support.processes import PYTHON, ROOT, Coordinator, spawn, wait_ready_file
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes

DEPLOYMENTS, ENGINES, SERVING = 8, 8, 6
LIVE_STATES = {"serving", "idle", "paused"}


def _spec(api: httpx.Client) -> list[dict[str, Any]]:
    spec = []
    for d in range(DEPLOYMENTS):
        name = f"fleet-{d}"
        body = {"name": name, "launcher": "static", "min_dp_size": 1, "max_dp_size": ENGINES,
                "engine": EngineConfig().model_dump()}  # fmt: skip
        assert api.post("/v1/deployments", json=body).status_code == 201
        check = key_check(api.post(f"/v1/deployments/{name}/agent-key").json()["key"])
        spec += [
            {"engine_id": f"{name}-e{i}", "deployment": name, "rank": None, "world": 0, "generation": 0,
             "key_check": check}
            for i in range(ENGINES)
        ]  # fmt: skip
    return spec


class EventStream(threading.Thread):
    """One SSE client on one job: the sequence numbers it was sent, until the stream ends."""

    def __init__(self, base: str, headers: dict[str, str], job_id: str) -> None:
        super().__init__(daemon=True)
        self.base, self.headers, self.job_id = base, headers, job_id
        self.seqs: list[int] = []

    def run(self) -> None:
        with (
            httpx.Client(base_url=self.base, headers=self.headers, timeout=None) as http,
            http.stream("GET", f"/v1/reconfigurations/{self.job_id}/events") as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data:"):
                    payload = json.loads(line[5:])
                    if isinstance(payload, dict) and "seq" in payload:
                        self.seqs.append(payload["seq"])


def test_a_fleet_of_64_engines_keeps_every_heartbeat_job_and_event(tmp_path: Path) -> None:
    env = {
        "EPCTL_RUNNER_ENABLED": "true",
        "EPCTL_HEARTBEAT_TIMEOUT_S": "10",
        "EPCTL_RUNNER_POLL_INTERVAL_S": "0.1",
    }
    with Coordinator(f"sqlite:///{tmp_path / 'coordinator.db'}", tmp_path / "data", env=env) as coordinator:
        api = coordinator.api
        spec_file, ready = tmp_path / "fleet.json", tmp_path / "ready.json"
        spec_file.write_text(json.dumps(_spec(api)))
        argv = [PYTHON, str(ROOT / "benchmarks" / "lightweight_agent.py"), "--fleet", str(spec_file),
                "--ready-file", str(ready), "--register", coordinator.url, "--token", coordinator.admin_token,
                "--heartbeat-s", "2"]  # fmt: skip
        agents = spawn("agents", argv, tmp_path / "agents.log")
        try:
            control = json.loads(wait_ready_file(ready, agents, timeout_s=60))[0]["control"]
            time.sleep(4.5)  # every agent past its first heartbeats

            headers = {"Authorization": f"Bearer {coordinator.admin_token}"}
            job_ids = []
            for d in range(DEPLOYMENTS):  # one job per deployment, all at once: each forms its generation
                target = SERVING - d % 2
                response = api.post(
                    "/v1/reconfigurations", json={"deployment": f"fleet-{d}", "target_dp_size": target}
                )
                assert response.status_code == 202, response.text
                job_ids.append(response.json()["id"])
            streams = [EventStream(coordinator.url, headers, job_id) for job_id in job_ids]
            for stream in streams:
                stream.start()

            seen_lost: set[str] = set()

            def all_terminal() -> list[dict[str, Any]] | None:
                engines = api.get("/v1/engines").json()["data"]
                seen_lost.update(e["id"] for e in engines if e["state"] not in LIVE_STATES)
                jobs = [api.get(f"/v1/reconfigurations/{j}").json() for j in job_ids]
                return jobs if all(job["terminal"] for job in jobs) else None

            jobs = wait_until(all_terminal, timeout_s=60, what="every job to end", interval_s=0.3)
            for stream in streams:
                stream.join(timeout=15)
            time.sleep(2.5)  # a heartbeat after the jobs from every engine
            beats = httpx.get(f"{control}/stats").json()
            engines = {e["id"]: e for e in api.get("/v1/engines").json()["data"]}
        finally:
            agents.stop()

    # Every heartbeat recorded: each was answered 200 after its commit; none refused or forgotten.
    assert beats["failed"] == 0 and beats["reregistered"] == 0, beats | {"rtt_ms": "..."}
    assert beats["ok"] >= 64 * 2
    assert len(engines) == 64 and sorted(beats["last_ok"]) == sorted(engines)
    # No heartbeating engine shown lost, at any poll, nor at the end.
    assert not seen_lost and all(e["state"] in LIVE_STATES for e in engines.values())
    for job, stream in zip(jobs, streams, strict=True):
        seqs = [event["seq"] for event in job["events"]]
        assert job["state"] == "succeeded", (job["id"], job["state"], job.get("error"))
        assert seqs == list(range(1, len(seqs) + 1)), (job["id"], seqs)  # a gapless log
        assert stream.seqs == seqs, (job["id"], stream.seqs, seqs)  # the stream lost no event
