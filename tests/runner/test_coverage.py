"""Coverage through the API (issue 38): every job records its placement's coverage; a deployment one
loss away from losing an expert carries `coverage-at-risk`; a shrink that would break coverage is
refused unless forced. Fake agents with the runner's real flow and a real database
(tests/runner/scenario.py); the failure domain is each agent's data host."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session

from app.deployments.coverage import coverage_condition
from app.deployments.engines.models import Engine
from app.jobs.states import JobState
from engine_agent.placement import slots_per_rank
from engine_agent.protocol import EngineConfig
from tests.runner.scenario import ENGINE, Scenario, make_scenario

# Room for a second replica of each of the 8 experts on 2 or more engines.
REDUNDANT = EngineConfig(num_logical_experts=8, num_redundant_experts=8, hidden_size=16, intermediate_size=32)


def on_hosts(stage: Scenario, hosts: dict[str, str]) -> None:
    """Engines on these data hosts (their failure domains), as their agents and their rows say."""
    with Session(stage.db) as session:
        for engine_id, host in hosts.items():
            stage.agents[engine_id].data_host = host
            row = session.get(Engine, engine_id)
            assert row is not None
            row.data_host = host
            session.add(row)
        session.commit()


def shown(client: TestClient) -> dict[str, Any]:
    answer = client.get("/v1/deployments/demo")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_covered_deployment_refuses_a_shrink_that_would_break_coverage_unless_forced(
    db_engine: DbEngine, client: TestClient
) -> None:
    stage = make_scenario(db_engine, serving=2, idle=1, engine=REDUNDANT)
    job = stage.run_job(3)
    assert job.state == JobState.succeeded.value
    assert job.coverage is not None and job.coverage["covered"] and job.coverage["at_risk"] == 0
    deployment = shown(client)
    assert deployment["coverage"]["covered"] and deployment["coverage"]["generation"] == 2
    assert [c for c in deployment["conditions"] if c["type"] == "coverage-at-risk"] == []

    refused = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 1})
    assert refused.status_code == 409, refused.text
    problem = refused.json()
    assert problem["code"] == "coverage-would-break" and "one engine" in problem["detail"]
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert shown(client)["active_job_id"] is None, "nothing was created"

    allowed = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2})
    assert allowed.status_code == 202, "two engines still hold two replicas of every expert"
    stage.cancel(allowed.json()["id"])
    forced = client.post(
        "/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 1, "force": True}
    )
    assert forced.status_code == 202, forced.text
    assert forced.json()["force"] is True


def test_a_shrink_onto_one_host_is_refused_where_the_replicas_span_two(
    db_engine: DbEngine, client: TestClient
) -> None:
    stage = make_scenario(db_engine, serving=2, idle=2, engine=REDUNDANT)
    engines = list(stage.agents)
    on_hosts(stage, dict(zip(engines, ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"], strict=True)))
    job = stage.run_job(4)
    assert job.coverage is not None and job.coverage["domains"] == 2
    assert job.coverage["at_risk_domain"] == 0, job.coverage
    retire_host_2 = {"deployment": "demo", "target_dp_size": 2, "retire": engines[2:]}
    refused = client.post("/v1/reconfigurations", json=retire_host_2)
    assert refused.status_code == 409 and refused.json()["code"] == "coverage-would-break", refused.text
    assert "10.0.0.1" in refused.json()["detail"]
    mixed = {"deployment": "demo", "target_dp_size": 2, "retire": [engines[1], engines[3]]}
    assert client.post("/v1/reconfigurations", json=mixed).status_code == 202


# One redundant slot in all: 3 engines x 3 slots hold 8 experts and one second replica.
ONE_SPARE_SLOT = EngineConfig(
    num_logical_experts=8, num_redundant_experts=1, hidden_size=16, intermediate_size=32
)


def test_a_deployment_one_loss_away_from_losing_an_expert_carries_coverage_at_risk(
    db_engine: DbEngine, client: TestClient
) -> None:
    stage = make_scenario(db_engine, serving=2, idle=1, engine=ONE_SPARE_SLOT)
    job = stage.run_job(3)
    assert job.coverage is not None
    experts = ENGINE.num_logical_experts
    at_risk = experts - (3 * slots_per_rank(experts, 1, 3) - experts)
    assert job.coverage["at_risk"] == at_risk == 7 and not job.coverage["covered"]
    assert sum(job.coverage["by_engine"].values()) == at_risk
    [condition] = [c for c in shown(client)["conditions"] if c["type"] == "coverage-at-risk"]
    assert condition["engine_id"] in stage.agents
    assert f"{at_risk} of {experts} layer-expert pairs have a single replica" in condition["message"]
    assert condition["engine_id"] in condition["message"]
    # Nothing to break: a shrink goes ahead.
    shrink = client.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 2})
    assert shrink.status_code == 202, shrink.text


def test_no_redundant_experts_keeps_the_figures_but_no_condition(
    db_engine: DbEngine, client: TestClient
) -> None:
    """An operator who configured no redundant expert chose single replicas: not a fault to flag."""
    stage = make_scenario(db_engine, serving=2, idle=1)
    assert ENGINE.num_redundant_experts == 0
    stage.run_job(3)
    deployment = shown(client)
    assert deployment["coverage"]["at_risk"] == 7 and not deployment["coverage"]["covered"]
    assert [c for c in deployment["conditions"] if c["type"] == "coverage-at-risk"] == []


AT_RISK = {"covered": False, "at_risk": 3, "layers": 1, "experts": 8, "by_engine": {"e1": 3}, "generation": 2}


@pytest.mark.parametrize(
    ("coverage", "num_redundant", "flagged"),
    [
        (AT_RISK, 1, True),
        (AT_RISK, 0, False),  # no redundancy configured: single replicas are the operator's choice
        ({**AT_RISK, "covered": True, "at_risk": 0}, 4, False),
        (None, 4, False),
    ],
)
def test_coverage_at_risk_only_where_redundancy_was_configured(
    coverage: dict[str, Any] | None, num_redundant: int, flagged: bool
) -> None:
    condition = coverage_condition(coverage, num_redundant=num_redundant)
    assert (condition is not None) is flagged
    if condition is not None:
        assert condition.type == "coverage-at-risk" and condition.engine_id == "e1"
