"""The front door on a live `epctl up`: a steady client that only ever calls the front door (HAProxy)
sees no failed request through 2 -> 4 -> 3 -> 2, a rolled-back and a cancelled job, and the rank-set
feed says, at each step, who is ready, draining and out (issue 35); each job's count of clients'
requests at the front door (our canaries counted apart) is what the client sent in its span."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from engine_agent import moe
from engine_agent.protocol import EngineConfig
from tests.frontdoor.conftest import require_haproxy
from tests.support.processes import clean_environment, epctl_command, free_port, spawn
from tests.support.stack import SteadyClient, failures_around
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes


class FeedWatcher:
    """Follows `GET .../endpoints?watch=true` from version `since`: every version it is answered, in
    order, resuming from the last one it read when the coordinator was down."""

    def __init__(self, base: str, headers: dict[str, str], since: int = 0) -> None:
        self.base, self.headers, self.since = base, headers, since
        self.versions: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FeedWatcher:
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.versions

    def _run(self) -> None:
        version = self.since
        with httpx.Client(base_url=self.base, headers=self.headers, timeout=30) as http:
            while not self._stop.is_set():
                try:
                    response = http.get(
                        "/v1/deployments/demo/endpoints",
                        params={"watch": "true", "resourceVersion": version, "timeoutSeconds": 2},
                    )
                except httpx.TransportError:  # the coordinator is down: resume from `version` later
                    self._stop.wait(0.2)
                    continue
                if response.status_code != 200:
                    self._stop.wait(0.2)
                    continue
                body = response.json()
                if body["resourceVersion"] != version:
                    self.versions.append(body)
                    version = body["resourceVersion"]


def _adopted(log_path: Path) -> bool | None:
    return "adopted deployment demo as it runs" in log_path.read_text() or None


def _ended(api: httpx.Client, job_id: str) -> dict[str, Any] | None:
    body: dict[str, Any] = api.get(f"/v1/reconfigurations/{job_id}").json()
    return body if body["terminal"] else None


def _states(feed: dict[str, Any]) -> dict[str, str]:
    return {e["engine_id"]: e["state"] for e in feed["endpoints"]}


def _ready(feed: dict[str, Any]) -> list[str]:
    return sorted(e["engine_id"] for e in feed["endpoints"] if e["state"] == "ready")


def test_a_client_of_the_front_door_sees_no_failure_through_2_4_3_2_a_rollback_and_a_cancel(
    tmp_path: Path,
) -> None:
    require_haproxy()
    port, door_port = free_port(), free_port()
    env = clean_environment({"EPCTL_RUNNER_LOCAL_AGENT_ARGS": "--enable-fault-injection --heartbeat-s 1"})
    argv = [*epctl_command(), "up", "--port", str(port), "--front-door-port", str(door_port)]
    up = spawn(
        "epctl up", [*argv, "--data-dir", str(tmp_path / "data")], tmp_path / "up.log", env=env, cwd=tmp_path
    )
    door = f"http://127.0.0.1:{door_port}"
    haproxy_pid: int | None = None
    try:

        def welcome() -> str | None:
            text = up.log_path.read_text()
            return text if "export EPCTL_TOKEN=" in text else None

        output = up.wait_for(welcome, timeout_s=120, what="epctl up to print the token")
        assert f"front door (HAProxy): {door}/v1/infer" in output, output
        headers = {"Authorization": f"Bearer {output.split('export EPCTL_TOKEN=')[1].split()[0]}"}
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30)
        deployment = api.get("/v1/deployments/demo").json()
        assert deployment["front_door"]["url"] == door and "haproxy" in deployment["front_door"]["keeper"]
        haproxy_pid = _haproxy_pid(tmp_path / "data")

        engine = EngineConfig.model_validate(deployment["engine"])
        tokens = torch.randn(2, engine.hidden_size, generator=torch.Generator().manual_seed(3))
        expected = moe.reference_forward(engine, tokens).tolist()
        client = SteadyClient([door], tokens.tolist(), expected, streams=2, period_s=0.01).start()
        watcher = FeedWatcher(f"http://127.0.0.1:{port}", headers).start()
        client.wait_serving(count=20, timeout_s=60)

        jobs: dict[int, dict[str, Any]] = {}
        after: dict[int, dict[str, Any]] = {}
        spans: dict[int, tuple[float, float]] = {}
        restarted_at = 0.0
        for target in (4, 3, 2):
            posted_at = time.time()
            job_id = api.post(
                "/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": target}
            ).json()["id"]
            job = wait_until(
                partial(_ended, api, job_id), timeout_s=240, what=f"the job to {target} engines to end"
            )
            assert job["state"] == "succeeded", job
            spans[target] = (posted_at, time.time())
            jobs[target] = job
            after[target] = api.get("/v1/deployments/demo/endpoints").json()
            client.wait_serving(count=20, timeout_s=60)
            if target == 4:  # the coordinator crashes mid-cycle: the front door serves on, the watch resumes
                up.kill()
                restarted_at = time.time()
                up = spawn(
                    "epctl up",
                    [*argv, "--data-dir", str(tmp_path / "data")],
                    tmp_path / "up2.log",
                    env=env,
                    cwd=tmp_path,
                )
                up.wait_for(
                    partial(_adopted, up.log_path),
                    timeout_s=120,
                    what="the restarted epctl up to adopt the deployment",
                )
                wait_until(
                    lambda: api.get("/v1/deployments/demo").json()["status"] == "ready",
                    timeout_s=60,
                    what="the restarted coordinator to answer",
                )
        # A job that ends on the old generation gives the front door back as it was: rolled back (a
        # prepare that fails) and cancelled (a prepare held, then cancelled).
        key = api.post("/v1/deployments/demo/agent-key").json()["key"]
        agents = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=10)
        before = api.get("/v1/deployments/demo/endpoints").json()
        rank0 = next(e["address"] for e in before["endpoints"] if e["dp_rank"] == 0)
        ended: dict[str, dict[str, Any]] = {}
        for outcome, fault in (
            ("rolled_back", {"fail_prepare_at_step": "create_groups"}),
            ("cancelled", {"hang_prepare_at_step": "create_groups"}),
        ):
            agents.post(f"{rank0}/v1/faults", json=fault).raise_for_status()
            job_id = api.post(
                "/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 1}
            ).json()["id"]
            if outcome == "cancelled":
                wait_until(
                    lambda: "draining" in _states(api.get("/v1/deployments/demo/endpoints").json()).values(),
                    timeout_s=60,
                    what="the leaver draining at the front door",
                )
                api.post(f"/v1/reconfigurations/{job_id}/cancel").raise_for_status()
            ended[outcome] = wait_until(
                partial(_ended, api, job_id), timeout_s=120, what=f"the job that should end {outcome}"
            )
            agents.post(f"{rank0}/v1/faults", json={}).raise_for_status()
            restored = api.get("/v1/deployments/demo/endpoints").json()
            assert ended[outcome]["state"] == outcome, ended[outcome]
            assert (restored["generation"], _states(restored)) == (before["generation"], _states(before)), (
                restored
            )
            client.wait_serving(count=20, timeout_s=60)
        samples = client.stop()
        versions = watcher.stop()
        logs = {t: api.get(f"/v1/reconfigurations/{jobs[t]['id']}").json()["events"] for t in (3, 2)}
    finally:
        up.popen.send_signal(signal.SIGINT)
        try:
            up.popen.wait(timeout=60)
        finally:
            up.kill()

    failures = [s for s in samples if not s.ok]
    print(f"front door: {len(samples)} requests, {len(failures)} failed; feed versions {len(versions)}")
    for target, job in jobs.items():
        seen = client.outage_within(*spans[target])  # the same rule as the probe's, over the job's span
        print(
            f"job to {target}: downtime_ms {job['downtime_ms']}, client_outage_ms {job['client_outage_ms']} "
            f"(this test's client: {seen.ms if seen else 0.0}), "
            f"client_slowest_answer_ms {job['client_slowest_answer_ms']}, front door {job.get('front_door')}"
        )
        # The canary probe went through the front door: its figures are what a client saw.
        assert job["probe"]["through"] == "front-door" and job["probe"]["front_door"] == door, job["probe"]
        assert job["client_outage_ms"] is not None and job["probe"]["per_engine"] is not None
        # The front door's own accounting: requests it passed, none failed.
        counted = job["front_door_requests"]
        print(f"job to {target}: front door requests {counted}")
        assert counted["requests"] > 0 and counted["failed"] == {"5xx": 0, "connection": 0, "response": 0}
        leavers = [r["engine_id"] for r in job["engine_results"] if r["role"] == "leaving"]
        assert sorted(counted["drained"]) == sorted(leavers), counted
        # HAProxy's own per-request log: the requests in flight while the window was open, none failed.
        assert counted["held"] is not None and counted["held"]["failed"] == 0, counted
        # Its clients' requests apart from the probe's canaries: what this test's client sent. The front
        # door counts a request when it arrives (after the client sent it, before its answer) and read
        # its counters at the job's start and end, each read somewhere between two moments: a request
        # in flight across a read may be on either side of it, and nobody (the client, the front door)
        # can say which. So the job's count lies between the requests surely inside its span (sent
        # after the first read, answered before the last) and those that may be (overlapping it).
        senders = counted["by_sender"]
        (a0, b0), (a1, b1) = senders["counted_from"], senders["counted_until"]
        surely = sum(1 for s in samples if s.sent_at >= b0 and s.done_at <= a1)
        maybe = sum(1 for s in samples if s.done_at >= a0 and s.sent_at <= b1)
        print(f"job to {target}: clients' requests {senders['clients']}, this client's {surely}..{maybe}")
        assert surely > 0 and surely <= senders["clients"]["requests"] <= maybe, (senders, surely, maybe)
        assert senders["clients"]["failed"] == 0 and senders["canaries"]["requests"] > 0, senders
    # Two client streams and the canaries keep a request in flight nearly always: some were held.
    assert sum(jobs[t]["front_door_requests"]["held"]["count"] for t in jobs) >= 1, jobs
    assert len(samples) > 100 and failures == [], failures[:5]
    assert all(s.max_abs_error is not None and s.max_abs_error < 1e-4 for s in samples)

    for target, feed in after.items():  # at each step: exactly the new generation's members are ready
        job = jobs[target]
        members = sorted(r["engine_id"] for r in job["engine_results"] if r["new_rank"] is not None)
        assert feed["generation"] == job["to_generation"]
        assert _ready(feed) == members, (target, feed)
        leavers = [r["engine_id"] for r in job["engine_results"] if r["role"] == "leaving"]
        assert all(_states(feed).get(e, "out") == "out" for e in leavers), (target, feed)

    # The watch saw every version once, in order, through the coordinator's restart (it resumed from
    # the version it had read), and the leavers draining before they left.
    numbers = [v["resourceVersion"] for v in versions]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
    changed = [datetime.fromisoformat(v["changed_at"]).timestamp() for v in versions]
    assert min(changed) < restarted_at < max(changed), (restarted_at, changed)
    for target in (3, 2):
        leaver = next(r["engine_id"] for r in jobs[target]["engine_results"] if r["role"] == "leaving")
        assert any(_states(v).get(leaver) == "draining" for v in versions), (target, leaver)
    # The front door's steps are on the jobs' logs, drained before prepare.
    for target in (3, 2):
        kinds = [(e["kind"], e.get("message") or "") for e in logs[target]]
        drain = next(
            i for i, (k, m) in enumerate(kinds) if k == "front-door" and m.startswith("drain leavers")
        )
        prepared = next(i for i, (k, m) in enumerate(kinds) if k == "engines" and m == "prepared")
        assert drain < prepared and "front door applied version" in kinds[drain][1], kinds
    # Stopping `epctl up` stopped the HAProxy it adopted (an orphan since the crash: a zombie until
    # something reaps it).
    assert haproxy_pid is not None and not _alive(haproxy_pid)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _haproxy_pid(data: Path) -> int:
    config = str(data / "front-door" / "haproxy.cfg")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if config.encode() in cmdline:
                return int(proc.name)
    raise AssertionError(f"no haproxy with {config}")


@dataclass
class Deployed:
    """One `epctl up --engines 3` shared by the fault tests (each leaves it whole again: the launcher's
    `replace` grows it back to 3)."""

    api: httpx.Client
    coordinator: str
    headers: dict[str, str]
    door: str
    tokens: list[Any]
    expected: list[Any]

    def client(self) -> SteadyClient:
        return SteadyClient([self.door], self.tokens, self.expected, streams=2, period_s=0.01).start()

    def whole(self) -> dict[str, Any]:
        """Waits until the deployment serves 3 engines with no job running; the feed then."""

        def whole() -> dict[str, Any] | None:
            deployment = self.api.get("/v1/deployments/demo").json()
            feed: dict[str, Any] = self.api.get("/v1/deployments/demo/endpoints").json()
            settled = deployment["status"] == "ready" and not deployment["active_job_id"]
            return feed if settled and len(_ready(feed)) == 3 else None

        return wait_until(whole, timeout_s=240, what="the deployment whole again (3 engines ready)")

    def rank(self, rank: int) -> dict[str, Any]:
        return next(e for e in self.api.get("/v1/engines").json()["data"] if e["dp_rank"] == rank)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    require_haproxy()
    tmp_path = tmp_path_factory.mktemp("front-door-faults")
    port, door_port = free_port(), free_port()
    env = clean_environment({"EPCTL_RUNNER_LOCAL_AGENT_ARGS": "--heartbeat-s 1"})
    argv = [*epctl_command(), "up", "--port", str(port), "--front-door-port", str(door_port)]
    argv += ["--engines", "3", "--data-dir", str(tmp_path / "data")]
    up = spawn("epctl up", argv, tmp_path / "up.log", env=env, cwd=tmp_path)
    try:

        def welcome() -> str | None:
            text = up.log_path.read_text()
            return text if "export EPCTL_TOKEN=" in text else None

        output = up.wait_for(welcome, timeout_s=120, what="epctl up to print the token")
        headers = {"Authorization": f"Bearer {output.split('export EPCTL_TOKEN=')[1].split()[0]}"}
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, headers=headers, timeout=30) as api:
            engine = EngineConfig.model_validate(api.get("/v1/deployments/demo").json()["engine"])
            tokens = torch.randn(2, engine.hidden_size, generator=torch.Generator().manual_seed(4))
            expected = moe.reference_forward(engine, tokens).tolist()
            door = f"http://127.0.0.1:{door_port}"
            yield Deployed(api, base, headers, door, tokens.tolist(), expected)
    finally:
        up.popen.send_signal(signal.SIGINT)
        try:
            up.popen.wait(timeout=60)
        finally:
            up.kill()


def test_a_frozen_engine_is_taken_out_of_the_front_door_once_fenced_and_the_survivors_serve(
    deployed: Deployed,
) -> None:
    """SIGSTOP of rank 2 of 3, requests only to the front door. The survivors leave its group at the
    serving deadline naming it and the coordinator fences it: from the first version of the feed that
    does not list it ready it is `out` (fenced), never `ready` again while frozen; requests fail only
    around the freeze (those it held, those its broken group failed), and the survivors serve."""
    start = deployed.whole()
    client = deployed.client()
    watcher = FeedWatcher(deployed.coordinator, deployed.headers, start["resourceVersion"]).start()
    client.wait_serving(count=20, timeout_s=60)
    victim = deployed.rank(2)
    frozen_at = time.time()
    os.kill(int(victim["pid"]), signal.SIGSTOP)
    try:
        wait_until(
            lambda: (
                _states(deployed.api.get("/v1/deployments/demo/endpoints").json()).get(victim["id"])
                not in ("ready", None)
            ),
            timeout_s=60,
            what="the frozen engine out of the front door",
        )
        client.wait_serving(count=50, timeout_s=90)  # served on the survivors (a held request's timeout)
        served_again_at = time.time()
        while_frozen = watcher.versions[:]
    finally:
        with contextlib.suppress(ProcessLookupError):  # the launcher stops a fenced engine it replaced
            os.kill(int(victim["pid"]), signal.SIGCONT)
    deployed.whole()
    samples = client.stop()
    watcher.stop()

    failures_around(samples, frozen_at, served_again_at, "a SIGSTOP")
    states = [(v["resourceVersion"], _states(v).get(victim["id"])) for v in while_frozen]
    first_out = next(i for i, (_, state) in enumerate(states) if state != "ready")
    reason = next(e["reason"] for e in while_frozen[first_out]["endpoints"] if e["engine_id"] == victim["id"])
    print(f"the frozen engine in the feed: {states}; first out: {reason}")
    # Out the moment the record says it is lost (fenced on its peers' evidence, or silent past the
    # heartbeat timeout), never draining first as a leaver of the heal that follows.
    assert states[first_out][1] == "out" and reason in ("fenced", "unreachable"), while_frozen[first_out]
    assert all(state != "ready" for _, state in states[first_out:]), states


def test_an_engine_killed_is_taken_out_of_the_front_door_and_clients_are_served_on_the_survivors(
    deployed: Deployed,
) -> None:
    """SIGKILL of one of three engines: requests only ever go to the front door. The EP group breaks
    with it (every member's collective fails), so requests fail until the survivors form a generation
    of their own: every failure was in flight at the kill or sent after it, and none once the
    survivors served again; the feed lists the dead engine `out` with its reason (`lost` once written
    off) until a generation forms without it, then drops it, and the deployment serves without it."""
    start = deployed.whole()
    api = deployed.api
    client = deployed.client()
    watcher = FeedWatcher(deployed.coordinator, deployed.headers, start["resourceVersion"]).start()
    client.wait_serving(count=20, timeout_s=60)
    victim = deployed.rank(2)
    killed_at = time.time()
    os.kill(int(victim["pid"]), signal.SIGKILL)

    def taken_out() -> dict[str, Any] | None:
        feed: dict[str, Any] = api.get("/v1/deployments/demo/endpoints").json()
        return feed if _states(feed).get(victim["id"], "gone") != "ready" else None

    out = wait_until(taken_out, timeout_s=60, what="the killed engine out of the front door")
    client.wait_serving(count=50, timeout_s=60)  # served on the survivors
    served_again_at = time.time()
    healed = deployed.whole()
    client.wait_serving(count=20, timeout_s=60)
    samples = client.stop()
    versions = watcher.stop()

    print(f"the killed engine: {_states(out).get(victim['id'], 'not listed')}")
    failures_around(samples, killed_at, served_again_at, "a SIGKILL")
    # The feed says it is out and why for as long as the record keeps it (written off as `lost`, or
    # fenced or unreachable on the way), from the first version that does not list it ready until a
    # generation forms without it; once healed it is gone.
    seen = [
        (v["generation"], next((e for e in v["endpoints"] if e["engine_id"] == victim["id"]), None))
        for v in versions
    ]
    first_out = next(i for i, (_, e) in enumerate(seen) if e is None or e["state"] != "ready")
    while_lost = [e for generation, e in seen[first_out:] if generation == start["generation"]]
    print(f"the killed engine in the feed until healed: {[(e or {}).get('reason') for e in while_lost]}")
    assert while_lost and all(
        e is not None and e["state"] == "out" and e["reason"] in ("lost", "fenced", "unreachable")
        for e in while_lost
    ), seen[first_out:]
    assert victim["id"] not in _states(healed), healed

    # One loss, one client outage: the incident's figure is what its self-heal jobs carry.
    def measured() -> dict[str, Any] | None:
        found = api.get("/v1/incidents", params={"deployment": "demo"}).json()["data"]
        mine = [i for i in found if victim["id"] in i["engines"] and i["outage_evidence"] is not None]
        return mine[0] if mine else None

    incident = wait_until(measured, timeout_s=60, what="the incident's client outage")
    jobs = [api.get(f"/v1/reconfigurations/{j}").json() for j in incident["recovery_job_ids"]]
    print(
        f"incident {incident['id']}: client outage {incident['client_outage_ms']} ms "
        f"({incident['outage_evidence']}); recovery jobs "
        f"{[(j['id'], j['client_outage_ms'], (j['probe'] or {}).get('through')) for j in jobs]}"
    )
    assert jobs and incident["client_outage_ms"] is not None, incident
    assert all(j["client_outage_ms"] == incident["client_outage_ms"] for j in jobs), (incident, jobs)
