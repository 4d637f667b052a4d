"""Failures before commit cost nothing, and nothing hangs: policy mismatch, abort, the pause lease,
and a background cleanup failure that blocks the next prepare until it is retried. Real agent
processes on loopback, driven through HTTP."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import pytest
import torch

from engine_agent import moe
from engine_agent.protocol import AgentState, ReconfigPhase, Timeouts, WarmupPolicy
from tests.agent.driver import (
    REL_TOL,
    SHORT,
    SMALL,
    AgentProcess,
    Driver,
    JobFailed,
    assert_serves_reference,
    random_tokens,
    relative_error,
)

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]


def start_job(
    driver: Driver, new_members: list[AgentProcess], **options: object
) -> tuple[str, list[AgentProcess]]:
    """POST prepare to every participant; returns (job id, participants)."""
    request = driver.prepare_request(new_members, **options)  # type: ignore[arg-type]
    everyone = driver.participants(request, [*driver.members, *new_members])
    driver.post_all(everyone, "/v1/reconfig/prepare", request.model_dump(mode="json"))
    return request.job_id, everyone


def test_policy_mismatch_fails_fast_naming_the_disagreeing_engine(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    agents[1].faults(warmup_policy_override=WarmupPolicy.deferred)
    # A rendezvous deadline far beyond the test's wait: only the agreement check can end the job in time.
    slow = Timeouts(rendezvous_s=120, collective_s=120, transfer_s=120, pause_lease_s=10)
    job_id, everyone = start_job(driver, agents, policy=WarmupPolicy.eager, timeouts=slow)
    statuses = driver.wait_phase(everyone, ReconfigPhase.failed, timeout_s=20)
    for status in statuses.values():
        assert status.error is not None and status.error.type == "policy-mismatch"
        assert status.error.engines == ["e1"]
        assert "e1" in status.error.message and "deferred" in status.error.message
    driver.abort(everyone, job_id)
    assert_serves_reference(agents[:1])
    assert agents[1].info().state == AgentState.idle
    agents[1].faults()  # the override gone, the same change goes through
    driver.reconfigure(agents)
    assert_serves_reference(agents)


def test_abort_during_prepare_leaves_the_old_generation_serving(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    agents[1].faults(hang_prepare_at_step="transfer")
    job_id, everyone = start_job(driver, agents)
    driver.wait_step(agents[1], "transfer")
    statuses = driver.abort(everyone, job_id)
    assert all(s.pause is None for s in statuses.values())  # never stopped: downtime 0
    assert_serves_reference(agents[:1])
    assert [a.info().generation for a in agents] == [1, 0]
    assert agents[1].info().state == AgentState.idle
    again = driver.abort(everyone, job_id)  # idempotent
    assert all(s.phase == ReconfigPhase.aborted for s in again.values())
    driver.reconfigure(agents)
    assert_serves_reference(agents)


def test_abort_after_pause_resumes_the_old_generation(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    job_id, everyone = start_job(driver, agents)
    driver.wait_phase(everyone, ReconfigPhase.prepared)
    driver.post_all(everyone, "/v1/reconfig/sync", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.synced)
    driver.post_all(everyone, "/v1/reconfig/pause", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.paused)
    assert agents[0].info().state == AgentState.paused
    statuses = driver.abort(everyone, job_id)
    pause = statuses["e0"].pause
    assert pause is not None and pause.resumed_at is not None and pause.resumed_at >= pause.paused_at
    assert [a.info().state for a in agents] == [AgentState.serving, AgentState.idle]
    assert_serves_reference(agents[:1])


def test_a_paused_engine_resumes_its_old_generation_when_the_lease_runs_out(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    job_id, everyone = start_job(driver, agents)
    driver.wait_phase(everyone, ReconfigPhase.prepared)
    driver.post_all(everyone, "/v1/reconfig/sync", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.synced)
    driver.post_all(everyone, "/v1/reconfig/pause", {"job_id": job_id, "lease_s": 1.0})
    driver.wait_phase(everyone, ReconfigPhase.paused)
    tokens = random_tokens(SMALL, 4)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(agents[0].infer, tokens)  # waits out the pause; never failed by it
        statuses = driver.wait_phase(everyone, ReconfigPhase.failed, timeout_s=20)
        response = stalled.result(timeout=20)
    assert response.status_code == 200
    assert (
        relative_error(torch.tensor(response.json()["outputs"]), moe.reference_forward(SMALL, tokens))
        < REL_TOL
    )
    assert response.json()["generation"] == 1
    for status in statuses.values():
        assert status.error is not None and status.error.type == "pause-lease-expired"
    refused = agents[0].post("/v1/reconfig/switch", {"job_id": job_id})
    assert refused.status_code == 409 and refused.json()["code"] == "pause-lease-expired"
    assert [a.info().state for a in agents] == [AgentState.serving, AgentState.idle]
    assert_serves_reference(agents[:1])


def wait_cleanup_settled(agent: AgentProcess) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while True:
        cleanup: dict[str, object] = agent.get("/v1/cleanup").json()
        if cleanup["state"] != "running" or time.monotonic() > deadline:
            return cleanup
        time.sleep(0.02)


def failure_metric(agent: AgentProcess) -> float:
    for line in agent.get("/metrics").text.splitlines():
        if line.startswith("epctl_agent_cleanup_failures_total "):
            return float(line.split()[1])
    raise AssertionError("no cleanup failure metric")


def test_a_cleanup_failure_is_reported_once_and_blocks_the_next_prepare_until_retried(
    spawn_agents: Spawn,
) -> None:
    agents = spawn_agents(2)
    driver = Driver(timeouts=SHORT.model_copy(update={"rendezvous_s": 5.0}))
    driver.reconfigure(agents[:1])
    agents[0].faults(fail_next_cleanup=True)
    scale_up = driver.reconfigure(agents)  # commits; the retired generation 1 fails to clean up on e0
    assert_serves_reference(agents)
    cleanup = wait_cleanup_settled(agents[0])
    assert cleanup["state"] == "failed"
    failure = cleanup["failure"]
    assert isinstance(failure, dict)
    assert (failure["job_id"], failure["generation"], failure["ok"]) == (scale_up.job_id, 1, False)
    assert failure_metric(agents[0]) == 1.0
    assert agents[0].get("/v1/cleanup").json()["failure"] == failure  # kept, not raised

    with pytest.raises(JobFailed) as refused:
        driver.reconfigure(agents[:1])
    error = refused.value.statuses["e0"].error
    assert error is not None and error.type == "cleanup-failed"
    assert scale_up.job_id in error.message and "generation 1" in error.message
    assert_serves_reference(agents)  # the refused job cost nothing

    assert agents[0].post("/v1/cleanup/retry").status_code == 202
    cleanup = wait_cleanup_settled(agents[0])
    assert cleanup["state"] == "idle" and cleanup["failure"] is None
    recent = cleanup["recent"]
    assert isinstance(recent, list) and [r["ok"] for r in recent[:2]] == [True, False]
    assert failure_metric(agents[0]) == 1.0  # one failure, reported once
    assert agents[0].post("/v1/cleanup/retry").status_code == 409  # nothing left to retry

    driver.reconfigure(agents[:1])
    assert_serves_reference(agents[:1])


def test_acknowledging_a_cleanup_failure_unblocks_prepare(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    agents[0].faults(fail_next_cleanup=True)
    driver.reconfigure(agents)
    assert wait_cleanup_settled(agents[0])["state"] == "failed"
    acknowledged = agents[0].post("/v1/cleanup/acknowledge")
    assert acknowledged.status_code == 200 and acknowledged.json()["failure"] is None
    driver.reconfigure(agents[:1])
    assert_serves_reference(agents[:1])


def test_a_leaver_stops_admitting_at_its_pause_and_goes_idle_at_switch(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents)
    job_id, everyone = start_job(driver, agents[:1])  # e1 leaves
    driver.wait_phase(everyone, ReconfigPhase.prepared)
    assert_serves_reference(agents)  # the leaver still serves through prepare (and sync)
    driver.post_all(everyone, "/v1/reconfig/sync", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.synced)
    driver.post_all(everyone, "/v1/reconfig/pause", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.paused)
    refused = agents[1].infer(random_tokens(SMALL, 2))  # refused at once: it drained, admits nothing
    assert refused.status_code == 503 and refused.headers["content-type"] == "application/problem+json"
    assert "no longer admits" in refused.json()["detail"]
    driver.post_all(everyone, "/v1/reconfig/switch", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.committed)
    assert agents[1].info().state == AgentState.idle
    assert agents[1].infer(random_tokens(SMALL, 2)).status_code == 503
    assert_serves_reference(agents[:1])


def test_one_members_pause_stops_every_member_and_abort_restarts_them(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents)
    job_id, everyone = start_job(driver, agents)  # rebuild the same two engines as generation 2
    driver.wait_phase(everyone, ReconfigPhase.prepared)
    driver.post_all(everyone, "/v1/reconfig/sync", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.synced)
    driver.post_all(agents[:1], "/v1/reconfig/pause", {"job_id": job_id})  # e0 only
    driver.wait_phase(agents[:1], ReconfigPhase.paused)
    deadline = time.monotonic() + 10
    while agents[1].info().state != AgentState.paused and time.monotonic() < deadline:
        time.sleep(0.02)
    assert agents[1].info().state == AgentState.paused  # stopped at the same step boundary
    assert agents[1].status().phase == ReconfigPhase.synced  # without a pause request of its own
    driver.abort(everyone, job_id)
    assert [a.info().state for a in agents] == [AgentState.serving, AgentState.serving]
    assert_serves_reference(agents)


def test_an_absent_member_fails_prepare_at_the_rendezvous_deadline_naming_it(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1)
    driver = Driver()
    driver.reconfigure([agent])
    request = driver.prepare_request([agent], timeouts=SHORT.model_copy(update={"rendezvous_s": 1.0}))
    ghost = request.members[0].model_copy(update={"engine_id": "ghost", "url": "http://127.0.0.1:9"})
    request = request.model_copy(
        update={"members": [*request.members, ghost], "placement": driver.plan([agent, agent])}
    )
    driver.post_all([agent], "/v1/reconfig/prepare", request.model_dump(mode="json"))
    status = driver.wait_phase([agent], ReconfigPhase.failed, timeout_s=20)["e0"]
    assert status.error is not None and status.error.type == "rendezvous-timeout"
    assert status.error.engines == ["ghost"] and status.error.step == "agree"
    driver.abort([agent], request.job_id)
    assert_serves_reference([agent])
