"""Serving never depends on the coordinator (issue 22), on real processes: a coordinator that is gone
for longer than the old 15 s orphan grace costs no request and a restarted one adopts what runs (the
coordinator's boundary), and a frozen member is fenced on its peers' evidence, not at its heartbeat
timeout, then re-admitted (the one real-process test of a freeze outside a job), while a member that is
only slow, on a loaded host, is never fenced (issue 39). What a restarted
coordinator does with a member that is gone, frozen or changed is the liveness judge's (rows of
tests/runner/test_liveness_rules.py, written in tests/runner/test_stalls.py).

The heartbeat timeout here is 15 s, as in production, so a frozen member is fenced on evidence (its
peers report that they wait on it and that it does not answer their probe, the coordinator's own probe
gets no answer either, issue 39) before the 5 s serving deadline, let alone its heartbeat timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from app.launchers.local import LocalLauncher
from tests.support.e2e import Stack
from tests.support.invariants import assert_recovered
from tests.support.stack import SteadyClient, agent_http, agent_info
from tests.support.waiting import wait_until

COORDINATOR_ENV = {
    "EPCTL_HEARTBEAT_TIMEOUT_S": "15",
    "EPCTL_RUNNER_SERVING_COLLECTIVE_S": "5",
    # Far longer than any wait here: a restart that waited out its own lease would fail these tests.
    "EPCTL_JOB_LEASE_S": "600",
}
# Longer than the orphan grace engines used to wait for a coordinator before they exited (15 s, counted
# from the last contact, which is before the kill); no other timer of an agent's falls in 15-20 s.
COORDINATOR_DOWN_S = 16.0


@contextlib.contextmanager
def deployment_of(
    stack: Stack, on_engine_loss: str, size: int = 2
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A deployment of `size` serving engines of its own: (name, its members in rank order)."""
    coordinator = stack.coordinator
    name = f"outlive-{uuid.uuid4().hex[:6]}"
    coordinator.create_deployment(name, on_engine_loss=on_engine_loss)
    try:
        job = stack.scale_to(size, name)
        assert job["state"] == "succeeded", job["error"]
        yield name, coordinator.members(job)
    finally:
        LocalLauncher(coordinator.data_dir).stop_all(deployment=name)


def pids(members: list[dict[str, Any]]) -> list[int]:
    return [int(agent_info(m["url"])["pid"]) for m in members]


def steady(stack: Stack, urls: list[str]) -> SteadyClient:
    return SteadyClient(urls, stack.tokens, stack.expected, streams=2, period_s=0.02).start()


def test_a_coordinator_gone_longer_than_the_old_grace_costs_no_request(stack: Stack) -> None:
    """SIGKILL, then a restart 16 s later: every request of a steady client succeeds meanwhile, the
    same engine processes serve, and the restarted coordinator adopts them (it says so)."""
    coordinator = stack.coordinator
    with deployment_of(stack, "replace") as (name, members):
        before = pids(members)
        client = steady(stack, [m["url"] for m in members])
        try:
            client.wait_serving()
            coordinator.kill()
            down_since = time.time()
            time.sleep(COORDINATOR_DOWN_S)
            served_while_down = client.successes_between(down_since, time.time())
            coordinator.start(ready_timeout_s=60.0, **stack.env)
            wait_until(
                lambda: f"adopted deployment {name} as it runs" in coordinator.log_tail(20000),
                timeout_s=30,
                what="the restarted coordinator to adopt the deployment",
                describe=coordinator.log_tail,
            )
            client.wait_serving()
        finally:
            samples = client.stop()
        assert served_while_down > 0
        assert [s for s in samples if not s.ok] == [], [s.error for s in samples if not s.ok][:3]
        assert pids(members) == before
        deployment = assert_recovered(stack, name)
        assert deployment["current_dp_size"] == 2


def test_a_frozen_member_is_fenced_on_evidence_and_re_admitted_once_it_thaws(stack: Stack) -> None:
    """SIGSTOP of rank 1 while serving: rank 0 leaves the group at the serving deadline naming it, the
    coordinator fences it (not stopped) and re-forms the generation on rank 0 before the frozen one's
    heartbeat timeout could expire it; after SIGCONT the grow-back re-admits the same process."""
    coordinator = stack.coordinator
    with deployment_of(stack, "replace") as (name, members):
        before = coordinator.deployment(name)
        frozen_id, frozen_pid = members[1]["engine_id"], pids(members)[1]
        client = steady(stack, [members[0]["url"]])
        try:
            client.wait_serving()
            frozen_at = time.time()
            os.kill(frozen_pid, signal.SIGSTOP)
            try:

                def on_survivor() -> dict[str, Any] | None:
                    found = coordinator.deployment(name)
                    moved = found["generation"] > before["generation"] and found["status"] == "ready"
                    return found if moved and found["current_dp_size"] == 1 else None

                wait_until(
                    on_survivor, timeout_s=60, what="the survivor serving a new generation", interval_s=0.2
                )
                client.wait_serving()
                serving_again_s = time.time() - frozen_at
                fenced = {e["id"]: e for e in coordinator.engines(name)}[frozen_id]
                assert fenced["state"] == "fenced", fenced  # out of the generation, not stopped
                assert LocalLauncher(coordinator.data_dir).records().get(frozen_id), "still recorded"
                jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name}).json()["data"]
                heal = next(j for j in jobs if j["requested_by"] == "self-heal")
                # Issue 39: fenced on the frozen rule (its peer waited on it, nobody got an answer, the
                # survivor told to leave), not at the serving deadline (`stalled`).
                frozen_why = "frozen: its peers wait on it, nobody gets an answer"
                assert f"{frozen_id} ({frozen_why})" in heal["reason"], heal["reason"]
            finally:
                os.kill(frozen_pid, signal.SIGCONT)

            def re_admitted() -> dict[str, Any] | None:
                found = coordinator.deployment(name)
                whole = found["status"] == "ready" and found["active_job_id"] is None
                return found if whole and found["current_dp_size"] == 2 else None

            wait_until(re_admitted, timeout_s=120, what="the thawed engine re-admitted", interval_s=0.5)
        finally:
            client.stop()
        print(f"serving again on the survivor {serving_again_s:.1f} s after the freeze")
        # The outage is on a record: the incident, with what clients saw (the canary probe).
        (incident,) = coordinator.api.get("/v1/incidents", params={"deployment": name}).json()["data"]
        assert incident["reason"] == "engine-stalled" and frozen_id in incident["engines"], incident
        assert incident["state"] == "resolved" and incident["client_outage_ms"] is not None, incident
        print(f"incident: client outage {incident['client_outage_ms']} ms")
        serving = {e["id"]: e for e in coordinator.engines(name) if e["state"] == "serving"}
        assert frozen_id in serving and int(agent_info(serving[frozen_id]["url"])["pid"]) == frozen_pid
        assert_recovered(stack, name)
        wrong = [s for s in client.samples if s.ok and (s.max_abs_error or 0.0) > 1e-4]
        assert wrong == []


def test_a_slow_member_on_a_loaded_host_is_never_fenced(stack: Stack) -> None:
    """Issue 39: rank 1's serving loop computes 2.5 s (Python work in its serving thread) before each of
    its next 3 steps while two busy processes load the cores: rank 0 waits on it in the step's collective
    past its slow mark (0.5 s) and tells the coordinator, but rank 1 heartbeats and answers every probe
    meanwhile, so it is only slow: never fenced, the generation serves on, no job, no incident."""
    coordinator = stack.coordinator
    with deployment_of(stack, "replace") as (name, members):
        before = coordinator.deployment(name)
        waiting, slow = members
        client = steady(stack, [m["url"] for m in members])
        load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            client.wait_serving()
            steps_before = agent_info(slow["url"])["serving_steps"]
            fault = {"slow_steps": 3, "slow_step_s": 2.5}
            agent_http.post(f"{slow['url']}/v1/faults", json=fault, timeout=5).raise_for_status()
            # The evidence path ran: the waiting member said it is stuck in the slow one's collective.
            said = f"engine {waiting['engine_id']} stuck"
            wait_until(lambda: said in coordinator.log_tail(400_000), timeout_s=60, what="a stuck report")
            # The slow steps are over once it stepped well past them (each is one iteration).
            wait_until(
                lambda: agent_info(slow["url"])["serving_steps"] >= steps_before + 10,
                timeout_s=120,
                what="the slow member stepping on",
                interval_s=0.2,
            )
            client.wait_serving()
        finally:
            for burner in load:
                burner.kill()
                burner.wait()
            client.stop()
        states = {e["id"]: e["state"] for e in coordinator.engines(name)}
        assert states == {m["engine_id"]: "serving" for m in members}, states
        after = coordinator.deployment(name)
        assert (after["generation"], after["status"], after["current_dp_size"]) == (
            before["generation"],
            "ready",
            2,
        )
        jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name}).json()["data"]
        assert [j for j in jobs if j["requested_by"] == "self-heal"] == []
        assert coordinator.api.get("/v1/incidents", params={"deployment": name}).json()["data"] == []
        assert f"fenced {slow['engine_id']}" not in coordinator.log_tail(400_000)
        assert client.failures() == []
