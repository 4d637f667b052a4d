"""The agent's HTTP surface: errors are problem+json, long operations are 202, fault injection is
off unless enabled; and a generation can be rebuilt on the same single engine (1 -> 1)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine_agent.protocol import AgentState, ReconfigPhase
from tests.agent.driver import SMALL, AgentProcess, Driver, assert_serves_reference, random_tokens

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]
PROBLEM = "application/problem+json"


def test_errors_are_problem_json_and_fault_injection_is_off_by_default(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1, extra_args=())
    missing = agent.get("/v1/reconfig")
    assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM
    assert missing.json()["code"] == "no-job" and missing.json()["instance"] == "/v1/reconfig"

    idle = agent.infer(random_tokens(SMALL, 1))
    assert idle.status_code == 503 and idle.headers["content-type"] == PROBLEM

    bad = agent.post("/v1/reconfig/prepare", {"job_id": "x"})
    assert bad.status_code == 422 and bad.headers["content-type"] == PROBLEM
    assert {"type", "title", "status", "detail", "instance"} <= set(bad.json())

    wrong = agent.post("/v1/reconfig/sync", {"job_id": "nope"})
    assert wrong.status_code == 409 and wrong.json()["code"] == "no-job"

    assert agent.post("/v1/faults", {"fail_next_cleanup": True}).status_code == 404

    info = agent.info()
    assert (info.engine_id, info.state, info.generation, info.rank) == ("e0", AgentState.idle, 0, None)
    assert info.engine == SMALL and info.store.port > 0 and "gloo" in info.transfer_backends
    assert agent.get("/healthz").json()["status"] == "ok"
    metrics = agent.get("/metrics").text
    for name in (
        "epctl_agent_serving_steps_total",
        "epctl_agent_pause_seconds",
        "epctl_agent_transfer_bytes_total",
    ):
        assert name in metrics


def test_a_second_job_is_refused_while_one_is_active(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    agents[1].faults(hang_prepare_at_step="agree")
    first = driver.prepare_request(agents)
    driver.post_all(driver.participants(first, agents), "/v1/reconfig/prepare", first.model_dump(mode="json"))
    second = driver.prepare_request(agents).model_dump(mode="json")
    refused = agents[0].post("/v1/reconfig/prepare", second)
    assert refused.status_code == 409 and refused.json()["code"] == "job-in-progress"
    again = agents[0].post("/v1/reconfig/prepare", first.model_dump(mode="json"))
    assert again.status_code == 202 and again.json()["job_id"] == first.job_id  # a retried POST
    driver.abort(agents, first.job_id)


def test_a_single_engine_rebuilds_its_generation_in_place(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1)
    driver = Driver()
    driver.reconfigure([agent])
    assert_serves_reference([agent])
    outcome = driver.reconfigure([agent])
    status = outcome.statuses["e0"]
    assert status.role == "staying" and status.phase == ReconfigPhase.committed
    assert status.bytes_moved == status.bytes_total  # local copies only
    info = agent.info()
    assert (info.generation, info.world_size) == (2, 1)
    assert agent.get("/v1/cleanup").json()["recent"][0]["generation"] == 1
    assert_serves_reference([agent])
