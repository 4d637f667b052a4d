"""Two coordinators on one Postgres (an HA pair) protect the serving, not only the jobs (issue 22).

Coordinator A launches the engines (local launcher, its data directory) and runs a job; B shares the
database. A is SIGKILLed mid-job: the engines fail over to B for their heartbeats (each answer lists
every live coordinator), B takes the job over once A's lease runs out and finishes it, and a steady
client sees no failed request. And two coordinators started in the same second on an empty database
both come up (the start lock).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from app.launchers.local import LocalLauncher, is_agent_process
from engine_agent import moe
from tests.support.databases import module_database, postgres_schema, postgres_unavailable_reason
from tests.support.stack import ENGINE, StackCoordinator, SteadyClient, agent_info
from tests.support.waiting import wait_until

pytestmark = pytest.mark.databases("postgres")

ENV = {"EPCTL_HEARTBEAT_TIMEOUT_S": "15"}


@contextlib.contextmanager
def coordinators_on(url: str, tmp_path: Path) -> Iterator[tuple[StackCoordinator, StackCoordinator]]:
    """Coordinators A and B on `url`, each with its own data directory; both closed afterwards."""
    a, b = StackCoordinator(url, tmp_path / "a"), StackCoordinator(url, tmp_path / "b")
    try:
        yield a, b
    finally:
        for coordinator in (a, b):
            coordinator.close()


@pytest.fixture
def pair(db_backend: str, tmp_path: Path) -> Iterator[tuple[StackCoordinator, StackCoordinator]]:
    """Coordinators A and B on one new, migrated Postgres schema, neither started."""
    with module_database(db_backend, tmp_path) as url, coordinators_on(url, tmp_path) as both:
        yield both


def steady(urls: list[str]) -> SteadyClient:
    tokens = torch.randn(4, ENGINE.hidden_size, generator=torch.Generator().manual_seed(5))
    expected = moe.reference_forward(ENGINE, tokens).tolist()
    return SteadyClient(urls, tokens.tolist(), expected, streams=2, period_s=0.02).start()


@pytest.mark.parametrize(("point", "outcome"), [("prepared", "rolled_back"), ("armed", "succeeded")])
def test_killing_the_coordinator_that_launched_the_engines_mid_job_costs_no_serving(
    pair: tuple[StackCoordinator, StackCoordinator], point: str, outcome: str
) -> None:
    a, b = pair
    a.start(ready_timeout_s=60.0, **ENV)
    a.create_deployment("demo")
    assert a.wait_job(a.scale(2))["state"] == "succeeded"
    members = [e for e in a.engines() if e["state"] == "serving"]
    client = steady([e["url"] for e in members])
    try:
        client.wait_serving()
        a.kill()  # again with a hang point: it stops driving the next job there
        a.start(
            ready_timeout_s=60.0, EPCTL_RUNNER_TEST_HANG_AT=point, EPCTL_RUNNER_ARM_DEADLINE_S="120", **ENV
        )
        job_id = a.scale(3)
        assert a.wait_marker() == point
        b.start(ready_timeout_s=60.0, **ENV)
        wait_until(
            lambda: len(b.api.get("/v1/engines", params={"deployment": "demo"}).json()["data"]) >= 3,
            timeout_s=30,
            what="B to see the engines",
        )
        a.kill()
        job = b.wait_job(job_id, timeout_s=90)
        assert job["state"] == outcome, job
        # A is dead: B ended the job.

        def heartbeating_to_b() -> list[dict[str, Any]] | None:
            engines = [e for e in b.engines() if e["state"] == "serving"]
            fresh = all(e["last_heartbeat_at"] is not None for e in engines)
            return engines if fresh and len(engines) == (3 if outcome == "succeeded" else 2) else None

        wait_until(
            heartbeating_to_b, timeout_s=30, what="every member heartbeating to B", describe=b.log_tail
        )
        client.wait_serving()
    finally:
        samples = client.stop()
    failed = [s for s in samples if not s.ok]
    assert failed == [], [s.error for s in failed][:3]
    wrong = [s for s in samples if s.ok and (s.max_abs_error or 0.0) > 1e-4]
    assert wrong == []
    deployment = b.deployment()
    serving = [agent_info(e["url"]) for e in b.engines() if e["state"] == "serving"]
    assert deployment["current_dp_size"] == len(serving) and deployment["status"] == "ready", deployment
    assert {i["generation"] for i in serving} == {deployment["generation"]}
    recorded = {e["id"] for e in b.engines() if e["state"] != "left"}
    for coordinator in (a, b):  # no live agent process that no engine record names (A's joiner: stopped by B)
        records = LocalLauncher(coordinator.data_dir).records()
        alive = {
            engine_id for engine_id, entry in records.items() if is_agent_process(entry["pid"], engine_id)
        }
        assert alive <= recorded, (alive, recorded)


def test_two_coordinators_started_in_the_same_second_on_an_empty_postgres_both_come_up(
    db_backend: str, tmp_path: Path
) -> None:
    if (reason := postgres_unavailable_reason()) is not None:
        pytest.skip(reason)
    with postgres_schema(migrated=False) as url, coordinators_on(url, tmp_path) as (a, b):
        for coordinator in (a, b):  # both processes first, then both waits: they migrate at once
            coordinator.spawn(**ENV)
        for coordinator in (a, b):
            coordinator.wait_ready()
            assert coordinator.api.get("/readyz").status_code == 200
