"""The agent's bounded long-poll: `GET /v1/reconfig?job_id&until&wait_s` and the step POSTs' `wait_s`
answer once the phase is reached, or after `wait_s` with the current status; the default still
answers at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest

from engine_agent.protocol import LONG_POLL_HEADER, ReconfigPhase, ReconfigStatus
from tests.agent.driver import AgentProcess, Driver

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]
PROBLEM = "application/problem+json"
# Longer than any step of these tests takes, shorter than the waits asked for: an answer that only
# came when its wait ran out fails the test instead of passing late.
CALL_TIMEOUT_S = 20.0
LONG_WAIT_S = 30.0


def long_poll(agent: AgentProcess, job_id: str, until: str, wait_s: float) -> httpx.Response:
    return agent.client.get(
        "/v1/reconfig",
        params={"job_id": job_id, "until": until, "wait_s": wait_s},
        timeout=CALL_TIMEOUT_S,
    )


def step(agent: AgentProcess, name: str, body: object, wait_s: float) -> ReconfigStatus:
    response = agent.client.post(
        f"/v1/reconfig/{name}", json=body, params={"wait_s": wait_s}, timeout=CALL_TIMEOUT_S
    )
    assert response.status_code == 202, response.text
    assert LONG_POLL_HEADER in response.headers
    return ReconfigStatus.model_validate(response.json())


def test_each_step_given_wait_s_answers_in_its_end_phase(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1)
    request = Driver().prepare_request([agent])
    job = {"job_id": request.job_id}
    phases = [
        step(agent, "prepare", request.model_dump(mode="json"), LONG_WAIT_S).phase,
        step(agent, "sync", job, LONG_WAIT_S).phase,
        step(agent, "pause", job, LONG_WAIT_S).phase,
        step(agent, "switch", job, LONG_WAIT_S).phase,
    ]
    assert phases == [
        ReconfigPhase.prepared,
        ReconfigPhase.synced,
        ReconfigPhase.paused,
        ReconfigPhase.committed,
    ]


def test_a_long_poll_answers_after_wait_s_with_the_current_status(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1)
    agent.faults(hang_prepare_at_step="agree")
    driver = Driver()
    request = driver.prepare_request([agent])
    assert agent.post("/v1/reconfig/prepare", request.model_dump(mode="json")).status_code == 202
    driver.wait_step(agent, "agree")

    response = long_poll(agent, request.job_id, "prepared", 0.3)

    assert response.status_code == 200 and LONG_POLL_HEADER in response.headers
    status = ReconfigStatus.model_validate(response.json())
    assert (status.job_id, status.phase, status.step) == (request.job_id, ReconfigPhase.preparing, "agree")
    driver.abort([agent], request.job_id)


def test_a_long_poll_answers_once_the_phase_is_reached(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1)
    agent.faults(hang_prepare_at_step="agree")
    driver = Driver()
    request = driver.prepare_request([agent])
    assert agent.post("/v1/reconfig/prepare", request.model_dump(mode="json")).status_code == 202
    driver.wait_step(agent, "agree")
    answers: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: answers.append(long_poll(agent, request.job_id, "prepared,synced", LONG_WAIT_S))
    )
    waiter.start()

    agent.faults(release_hang=True)
    waiter.join(CALL_TIMEOUT_S + 5.0)

    assert answers and answers[0].status_code == 200, answers
    assert ReconfigStatus.model_validate(answers[0].json()).phase == ReconfigPhase.prepared


def test_a_long_poll_also_ends_when_the_job_fails(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1)
    agent.faults(fail_prepare_at_step="agree")
    request = Driver().prepare_request([agent])

    status = step(agent, "prepare", request.model_dump(mode="json"), LONG_WAIT_S)

    assert status.phase == ReconfigPhase.failed and status.error is not None
    assert status.error.type == "injected-failure"


def test_a_long_poll_for_another_job_or_phase_is_a_problem(spawn_agents: Spawn) -> None:
    (agent,) = spawn_agents(1)
    none_yet = long_poll(agent, "job-x", "prepared", 1.0)
    assert none_yet.status_code == 404 and none_yet.headers["content-type"] == PROBLEM
    assert none_yet.json()["code"] == "no-job"

    outcome = Driver().reconfigure([agent])
    wrong = long_poll(agent, "job-x", "prepared", 1.0)
    assert wrong.status_code == 409 and wrong.headers["content-type"] == PROBLEM
    assert wrong.json()["code"] == "wrong-job" and wrong.json()["current_job_id"] == outcome.job_id

    unknown_phase = long_poll(agent, outcome.job_id, "prepared,sleeping", 1.0)
    assert unknown_phase.status_code == 422 and unknown_phase.json()["code"] == "invalid-request"

    without_job = agent.client.get("/v1/reconfig", params={"wait_s": 1.0})
    assert without_job.status_code == 422 and without_job.json()["code"] == "invalid-request"
