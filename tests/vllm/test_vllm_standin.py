"""Jobs on a vLLM deployment against vLLM's OWN elastic EP route code over a STAND-IN engine client
(`standin_server.py`): the success path these machines cannot run for real, and every answer mapped.

A real coordinator process (job runner on) drives each job; the stand-in's scaling flag makes vLLM's
own middleware answer 503 to every route while a change runs, which is what the canaries measure.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.databases import module_database
from tests.support.stack import StackCoordinator
from tests.support.waiting import wait_until
from tests.vllm.conftest import (
    StandIn,
    event_kinds,
    progress_steps,
    run_job,
    start_coordinator,
)

pytestmark = pytest.mark.timeout(900)
DRAIN_TIMEOUT_S = 7
_names = itertools.count(1)


@pytest.fixture(scope="module")
def coordinator(
    db_backend: str, standin: StandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StackCoordinator]:
    """One coordinator per module, on SQLite (the database is not what these tests are about)."""
    tmp = tmp_path_factory.mktemp(f"vllm-standin-{db_backend}")
    with module_database(db_backend, tmp) as url:
        coordinator = start_coordinator(url, tmp / "data")
        try:
            yield coordinator
        finally:
            coordinator.close()


@pytest.fixture
def deployment(coordinator: StackCoordinator, standin: StandIn) -> str:
    """A fresh deployment on the stand-in, reset to DP size 1 with nothing running."""
    standin.reset()
    name = f"standin-{next(_names)}"
    created = coordinator.create_deployment(
        name,
        backend="vllm",
        launcher="static",
        vllm={"url": standin.url, "api_key": "standin-key", "drain_timeout_s": DRAIN_TIMEOUT_S},
    )
    assert created["current_dp_size"] == 1, created
    assert created["status"] == "ready", created
    return name


def phases_done(job: dict[str, Any], *names: str) -> bool:
    return all(job["phases"].get(n, {}).get("ended_at") for n in names)


def test_a_successful_scale_goes_through_every_phase_and_measures_the_503_window(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="success", delay_s=1.5)
    job = run_job(coordinator, deployment, 2)
    assert job["state"] == "succeeded", job
    assert phases_done(job, "preparing", "syncing", "committing", "cleaning_up")
    assert standin.state()["calls"] == [{"new_data_parallel_size": 2, "drain_timeout": DRAIN_TIMEOUT_S}]
    # Progress came from vLLM's scaling flag (its 503s) and the canaries while the call blocked.
    steps = progress_steps(job)
    assert "scaling:sent" in steps and "scaling:engine-scaling" in steps and "verifying" in steps
    assert {"preflight", "engine", "verified"} <= set(event_kinds(job))
    probe = job["probe"]
    assert probe["canaries_failed"] > 0 and probe["failures"].get("503", 0) > 0
    assert probe["phases"]["before"]["failed"] == 0
    assert probe["phases"]["committing"]["failed"] == probe["canaries_failed"]
    assert probe["phases"]["committing"]["longest_gap_ms"] > probe["phases"]["before"]["longest_gap_ms"]
    # The stand-in held its flag for 1.5 s; the canaries see about that (loose: a loaded machine).
    assert 750.0 <= job["client_outage_ms"] <= 6000.0
    assert probe["outage_phase"] == "committing"
    # The canaries' window covers vLLM's own 503 window (the stand-in's flag; one machine, one clock).
    ((set_at, cleared_at),) = standin.state()["flag_windows"]
    window = probe["outage_window"]
    assert window["start"] <= set_at + 0.5 and window["end"] >= cleared_at - 0.01
    assert job["downtime_ms"] == job["client_outage_ms"] == job["client_downtime_ms"]  # (deprecated alias)
    assert job["downtime"]["source"] == "canary-probe"
    assert probe["latency_p50_ms_outside_outage"] is not None
    # The probe stops only once the canaries, too, saw vLLM serve after its 200 (the outage ends on an
    # answer, and the slowest answer counts the answers from after the change). Which phase holds the
    # slowest one is the machine's noise: the stand-in answers every canary alike.
    verifying = probe["phases"]["verifying"]
    assert verifying["sent"] >= 1 and verifying["failed"] == 0 and verifying["slowest_answer_ms"] is not None
    assert job["client_slowest_answer_ms"] >= verifying["slowest_answer_ms"]
    assert probe["slowest_answer_phase"] in probe["phases"]
    after = coordinator.deployment(deployment)
    assert (after["current_dp_size"], after["generation"], after["status"]) == (2, 1, "ready")


def test_a_scale_down_succeeds_on_vllms_answer_as_its_metrics_cannot_show_it(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="success", delay_s=0.3)
    assert run_job(coordinator, deployment, 2)["state"] == "succeeded"
    job = run_job(coordinator, deployment, 1)
    assert job["state"] == "succeeded", job
    verified = next(e for e in job["events"] if e["kind"] == "verified")
    assert "200 answer" in verified["message"]
    assert standin.state()["metrics_dp_size"] == 2  # vLLM keeps the removed engine's series
    after = coordinator.deployment(deployment)
    assert (after["current_dp_size"], after["status"]) == (1, "ready")
    # And the record is still consistent: the next job's preflight does not see a mismatch.
    assert run_job(coordinator, deployment, 2)["state"] == "succeeded"


def test_400_is_invalid_for_this_engine_with_vllms_message(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="invalid")
    job = run_job(coordinator, deployment, 3)
    assert job["state"] == "rolled_back", job
    error = job["error"]
    assert (error["type"], error["http_status"], error["phase"]) == ("invalid-for-engine", 400, "committing")
    assert "stand-in limit" in error["message"]
    # vLLM refused before it set its scaling flag: no canary failed, the outage is no more than a wait.
    assert job["probe"]["canaries_failed"] == 0, job["probe"]
    slowest = job["client_slowest_answer_ms"]  # None: no canary sent in the job answered before its end
    outage = job["client_outage_ms"]
    assert outage is not None and (slowest is None or outage <= slowest), job
    assert coordinator.deployment(deployment)["status"] == "ready"


def test_408_fails_as_a_drain_timeout_and_leaves_the_deployment_serving(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="drain-timeout", delay_s=0.5)
    job = run_job(coordinator, deployment, 2)
    assert job["state"] == "failed", job
    assert (job["error"]["type"], job["error"]["http_status"]) == ("drain-timeout", 408)
    assert f"{DRAIN_TIMEOUT_S} s" in job["error"]["hint"]
    assert job["client_outage_ms"] > 0.0
    after = coordinator.deployment(deployment)
    assert (after["status"], after["current_dp_size"], after["generation"]) == ("ready", 1, 0)


def test_500_fails_with_vllms_answer_and_the_next_job_runs(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="error", delay_s=0.2)
    job = run_job(coordinator, deployment, 2)
    assert job["state"] == "failed", job
    assert (job["error"]["type"], job["error"]["http_status"]) == ("engine-scale-failed", 500)
    assert "Scale failed" in job["error"]["message"]
    # Checked afterwards: not scaling, and a no-op scale to its size is accepted: not wedged.
    assert standin.state()["calls"][-1]["new_data_parallel_size"] == 1
    assert coordinator.deployment(deployment)["status"] == "ready"
    standin.control("configure", outcome="success", delay_s=0.2)
    assert run_job(coordinator, deployment, 2)["state"] == "succeeded"


def test_409_means_someone_else_is_scaling_it(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="conflict")
    job = run_job(coordinator, deployment, 2)
    assert job["state"] == "rolled_back", job
    assert (job["error"]["type"], job["error"]["http_status"]) == ("engine-busy", 409)
    assert coordinator.deployment(deployment)["status"] == "ready"


def test_a_change_that_never_answers_fails_at_the_deadline_and_degrades_until_reconciled(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="hang")
    job = run_job(coordinator, deployment, 2)
    assert job["state"] == "failed", job
    assert job["error"]["type"] == "deadline-exceeded"
    after = coordinator.deployment(deployment)
    assert after["status"] == "degraded"
    assert after["status_detail"]["reason"] == "engine-stuck-scaling"
    assert "reconcile" in after["status_detail"]["hint"]
    # While it still says it is scaling, the next job stops in preflight and changes nothing.
    busy = run_job(coordinator, deployment, 2)
    assert (busy["state"], busy["error"]["type"]) == ("rolled_back", "engine-busy")
    standin.control("reset")  # the operator restarts it
    view = coordinator.api.post(f"/v1/deployments/{deployment}/engine/reconcile")
    assert view.status_code == 200, view.text
    assert (view.json()["status"], view.json()["consistent"]) == ("ready", True)


def test_a_failure_that_leaves_vllm_scaling_degrades_the_deployment(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="stuck", delay_s=0.2)
    job = run_job(coordinator, deployment, 2)
    assert (job["state"], job["error"]["http_status"]) == ("failed", 500)
    detail = coordinator.deployment(deployment)["status_detail"]
    assert detail["reason"] == "engine-stuck-scaling"
    assert job["error"]["hint"] == detail["hint"]
    standin.control("reset")


def test_an_engine_that_refuses_every_scale_afterwards_is_degraded(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="wedge", delay_s=0.2)
    job = run_job(coordinator, deployment, 2)
    assert (job["state"], job["error"]["type"]) == ("failed", "engine-scale-failed")
    detail = coordinator.deployment(deployment)["status_detail"]
    assert detail["reason"] == "engine-refuses-scaling"
    assert "no-op scale" in detail["message"]
    standin.control("reset")


def test_cancel_before_the_call_is_sent_sends_nothing(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    job_id = coordinator.scale(2, deployment)
    coordinator.wait_job(job_id, until={"syncing"}, timeout_s=60)
    response = coordinator.api.post(f"/v1/reconfigurations/{job_id}/cancel")
    assert response.status_code == 202, response.text
    job = coordinator.wait_job(job_id)
    assert job["state"] == "cancelled", job
    assert standin.state()["calls"] == []
    assert job["probe"]["canaries_sent"] > 0


def test_a_size_changed_outside_epctl_degrades_until_reconciled(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", dp_size=3, metrics_dp_size=3)  # someone scaled it to 3 behind our back
    job = run_job(coordinator, deployment, 2)
    assert (job["state"], job["error"]["type"]) == ("rolled_back", "dp-size-mismatch")
    assert coordinator.deployment(deployment)["status_detail"]["reason"] == "dp-size-mismatch"
    view = coordinator.api.post(f"/v1/deployments/{deployment}/engine/reconcile").json()
    assert (view["status"], view["current_dp_size"]) == ("ready", 3)
    assert standin.state()["calls"] == []


def test_a_coordinator_killed_during_the_scale_call_finishes_the_job_from_vllm(
    coordinator: StackCoordinator, standin: StandIn, deployment: str
) -> None:
    standin.control("configure", outcome="success", delay_s=4.0)
    job_id = coordinator.scale(2, deployment)
    coordinator.wait_job(job_id, until={"committing"}, timeout_s=60)
    wait_until(lambda: standin.state()["calls"], timeout_s=30, what="the scale call to reach vLLM")
    assert standin.state()["scaling"] is True
    coordinator.kill()
    coordinator.start()
    job = coordinator.wait_job(job_id, timeout_s=120)
    assert job["state"] == "succeeded", (job["error"], [e["message"] for e in job["events"]], standin.state())
    assert "recovery" in event_kinds(job)
    assert coordinator.deployment(deployment)["current_dp_size"] == 2
