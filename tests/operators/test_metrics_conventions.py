"""Metrics by Prometheus' book: base units, no `_created` series, `promtool check metrics` clean for the
coordinator and the agent; deployment gauges, jobs by deployment, HTTP requests by route and status, the
webhook backlog; and the HTTP service discovery of the agents' metrics (`/v1/sd/agents`)."""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.deployments.engines.models import Engine as EngineRow
from app.deployments.engines.models import EngineState
from app.deployments.models import Deployment
from app.webhooks import service as webhooks
from app.webhooks.delivery import DeliveryPolicy, DeliveryWorker
from tests.operators import rows
from tests.support.factories import register_engines
from tests.support.fixtures import token_headers
from tests.support.processes import ADMIN_TOKEN

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed: scripts/prometheus-tools installs Debian's prometheus"
)


@pytest.fixture(autouse=True)
def _no_background_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    monkeypatch.setenv("EPCTL_WEBHOOK_WORKER_ENABLED", "false")


def promtool_problems(text: str) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60, check=False
    )
    return (done.stdout + done.stderr).decode().strip() if done.returncode != 0 else ""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


def fleet(client: TestClient, db_engine: Engine) -> str:
    """Deployment d1 at DP size 2 (three engines: two serving, one left), a finished job, a webhook
    subscription with one pending delivery."""
    assert client.post("/v1/deployments", json={"name": "d1", "launcher": "static"}).status_code == 201
    with Session(db_engine) as session:
        deployment = session.exec(select(Deployment).where(Deployment.name == "d1")).one()
        engines = register_engines(session, deployment, 3)
        for engine, state in zip(engines, ["serving", "serving", "left"], strict=True):
            row = session.get(EngineRow, engine.id)
            assert row is not None
            row.state, row.dp_rank = state, engines.index(engine)
            session.add(row)
        deployment.current_dp_size = 2
        session.add(deployment)
        session.commit()
        webhooks.create_subscription(session, webhooks.WebhookCreate(url="http://127.0.0.1:9/nowhere"))
        rows.run_to_success(session, rows.make_job(session, deployment.id).id)
        return deployment.id


@pytest.mark.processes
def test_coordinator_metrics_pass_promtool_and_carry_no_created_series(
    client: TestClient, db_engine: Engine
) -> None:
    fleet(client, db_engine)
    DeliveryWorker(db_engine, DeliveryPolicy()).dispatch_outbox()
    client.get("/v1/deployments/nope")
    text = client.get("/metrics").text
    assert "_created" not in text
    assert not any(name.endswith("_ms") or "_ms_" in name for name, _ in samples(text))
    if PROMTOOL is not None:
        assert promtool_problems(text) == ""


@needs_promtool
@pytest.mark.processes
def test_agent_metrics_pass_promtool_in_base_units() -> None:
    from engine_agent.agent import AgentMetrics

    counters = SimpleNamespace(steps=3, dummy_steps=1, requests_served=2, tokens_served=40, pauses=1)
    agent_metrics = AgentMetrics(SimpleNamespace(counters=counters))  # type: ignore[arg-type]
    agent_metrics.pause_seconds.observe(0.0246)
    agent_metrics.bytes_transferred.inc(1024)
    text = generate_latest(agent_metrics.registry).decode()
    assert "_created" not in text and "epctl_agent_pause_seconds_bucket" in text
    assert promtool_problems(text) == ""


def test_deployment_gauges_carry_the_deployment_label(client: TestClient, db_engine: Engine) -> None:
    fleet(client, db_engine)
    text = client.get("/metrics").text
    assert value(text, "epctl_deployment_dp_size", deployment="d1") == 2
    assert value(text, "epctl_deployment_desired_dp_size", deployment="d1") == 2
    assert value(text, "epctl_deployment_status", deployment="d1", status="ready") == 1
    assert value(text, "epctl_deployment_status", deployment="d1", status="degraded") == 0
    assert value(text, "epctl_deployment_engines", deployment="d1", state="serving") == 2
    assert value(text, "epctl_deployment_engines", deployment="d1", state="left") is None


def test_jobs_count_by_deployment_with_their_duration(client: TestClient, db_engine: Engine) -> None:
    fleet(client, db_engine)
    DeliveryWorker(db_engine, DeliveryPolicy()).dispatch_outbox()
    text = client.get("/metrics").text
    labels = {"deployment": "d1", "outcome": "succeeded"}
    assert (value(text, "epctl_reconfiguration_jobs_total", requested_by="api", **labels) or 0) >= 1
    assert (value(text, "epctl_reconfiguration_job_duration_seconds_count", **labels) or 0) >= 1


def test_http_requests_count_by_route_template_and_status(client: TestClient) -> None:
    def count(route: str, status: str) -> float:
        return (
            value(
                client.get("/metrics").text,
                "epctl_http_requests_total",
                method="GET",
                route=route,
                status=status,
            )
            or 0
        )

    before = count("/v1/deployments/{name}", "404")
    client.get("/v1/deployments/ghost")
    client.get("/v1/deployments/phantom")
    assert count("/v1/deployments/{name}", "404") == before + 2
    assert 'route="/v1/deployments/ghost"' not in client.get("/metrics").text


def test_webhook_backlog_is_a_gauge_by_subscription(client: TestClient, db_engine: Engine) -> None:
    fleet(client, db_engine)
    DeliveryWorker(db_engine, DeliveryPolicy()).dispatch_outbox()
    text = client.get("/metrics").text
    backlog = {
        labels: v for (name, labels), v in samples(text).items() if name == "epctl_webhook_backlog_deliveries"
    }
    assert list(backlog.values()) == [5.0] and dict(next(iter(backlog)))["active"] == "true"
    [(name, labels)] = [key for key in samples(text) if key[0] == "epctl_webhook_oldest_pending_age_seconds"]
    assert dict(labels)["subscription"] == dict(next(iter(backlog)))["subscription"]
    assert (value(text, name, **dict(labels)) or 0) >= 0


def test_service_discovery_lists_serving_agents_as_prometheus_targets(
    client: TestClient, db_engine: Engine
) -> None:
    fleet(client, db_engine)
    groups: list[dict[str, Any]] = client.get("/v1/sd/agents").json()
    assert [g["targets"] for g in groups] == [["127.0.0.1:9000"], ["127.0.0.1:9001"]]
    assert groups[0]["labels"] == {
        "__scheme__": "http",
        "__metrics_path__": "/metrics",
        "deployment": "d1",
        "engine_id": "d1-engine-0",
        "dp_rank": "0",
        "platform": "cpu",
        "device": "cpu",
    }
    assert client.get("/v1/sd/agents", params={"deployment": "other"}).json() == []


def test_service_discovery_drops_engines_that_stopped_answering(
    client: TestClient, db_engine: Engine
) -> None:
    fleet(client, db_engine)
    with Session(db_engine) as session:
        row = session.get(EngineRow, "d1-engine-1")
        assert row is not None
        row.state = EngineState.unreachable.value
        session.add(row)
        session.commit()
    assert [g["labels"]["engine_id"] for g in client.get("/v1/sd/agents").json()] == ["d1-engine-0"]


def test_service_discovery_needs_a_token(client: TestClient) -> None:
    viewer = token_headers(client, "viewer")
    assert client.get("/v1/sd/agents", headers=viewer).status_code == 200
    assert client.get("/v1/sd/agents", headers={"Authorization": ""}).status_code == 401


def test_metrics_answer_without_a_token_and_carry_no_credential(
    client: TestClient, db_engine: Engine
) -> None:
    """`/metrics` is open, as Prometheus exporters usually are (docs/api.md says why): counts,
    durations and names, never a secret. Agent addresses (`/v1/sd/agents`) stay behind a viewer token."""
    fleet(client, db_engine)
    viewer = client.post("/v1/tokens", json={"name": "reader", "role": "viewer"}).json()["token"]
    hook = client.post("/v1/webhooks", json={"url": "https://hooks.example/hook"}).json()
    anonymous = {"Authorization": ""}
    response = client.get("/metrics", headers=anonymous)
    assert response.status_code == 200, response.text
    assert 'epctl_deployment_dp_size{deployment="d1"}' in response.text
    for secret in (viewer, hook["secret"], ADMIN_TOKEN):
        assert secret not in response.text
    assert client.get("/v1/sd/agents", headers=anonymous).status_code == 401


def test_coordinator_and_agent_report_their_process_and_build() -> None:
    from app.metrics import REGISTRY
    from engine_agent.agent import AgentMetrics
    from engine_agent.build_info import version

    counters = SimpleNamespace(steps=0, dummy_steps=0, requests_served=0, tokens_served=0, pauses=0)
    agent = generate_latest(AgentMetrics(SimpleNamespace(counters=counters)).registry).decode()  # type: ignore[arg-type]
    coordinator = generate_latest(REGISTRY).decode()
    for component, text in (("coordinator", coordinator), ("agent", agent)):
        found = samples(text)
        assert (found.get(("process_resident_memory_bytes", ())) or 0) > 0, component
        assert ("process_start_time_seconds", ()) in found, component
        [(labels, one)] = [(dict(k[1]), v) for k, v in found.items() if k[0] == "epctl_build_info"]
        assert (one, labels["component"], labels["version"]) == (1.0, component, version())
        assert labels["python_version"] and "python_info" in text
