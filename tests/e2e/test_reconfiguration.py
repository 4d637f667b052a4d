"""A scale request does the real thing: the coordinator drives real agent processes through prepare,
sync, the two-step commit and cleanup, while a client keeps sending requests to the engines.

Each test starts from the module's deployment at two serving engines (the `stack` fixture puts it
there), so any test runs alone or in any order.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import uuid
from typing import Any

import httpx
import pytest

from app.launchers.local import LocalLauncher
from tests.support.e2e import Stack
from tests.support.stack import SteadyClient, agent_http, agent_info
from tests.support.waiting import wait_until

# The client's view and the job's report of one stop must agree within this (the bound).
GAP_SLACK_MS = 20.0
GAP_SLACK_RATIO = 0.2
# A failed request must overlap a commit window, widened by this (requests in flight at its edges).
WINDOW_MARGIN_S = 0.05


def downtime_window(job: dict[str, Any]) -> tuple[float, float] | None:
    downtime = job.get("downtime") or {}
    if downtime.get("window_start") is None:
        return None
    return float(downtime["window_start"]), float(downtime["window_end"])


def client_for(stack: Stack) -> SteadyClient:
    return SteadyClient(stack.base, stack.tokens, stack.expected).start()


def hang_prepare_on(url: str, step: str = "transfer") -> None:
    """Fault injection: this agent's next prepare stops at `step` until aborted."""
    response = agent_http.post(f"{url}/v1/faults", json={"hang_prepare_at_step": step}, timeout=5)
    assert response.status_code == 200, response.text


def wait_agent_at(url: str, job_id: str, step: str | None = None, timeout_s: float = 30.0) -> None:
    """Until the agent runs `job_id` (at prepare step `step`, if given)."""

    def there() -> bool:
        status = agent_http.get(f"{url}/v1/reconfig", timeout=5)
        body = status.json() if status.status_code == 200 else {}
        return body.get("job_id") == job_id and (step is None or body.get("step") == step)

    wait_until(there, timeout_s=timeout_s, what=f"{url} to reach {step or 'prepare'} of {job_id}")


def wait_job_has_plan(stack: Stack, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    def planned() -> dict[str, Any] | None:
        job = stack.coordinator.job(job_id)
        return job if job["engine_results"] or job["state"] not in ("pending", "preparing") else None

    return wait_until(planned, timeout_s=timeout_s, what=f"job {job_id} to have its plan")


def wait_cleanup(stack: Stack, job_id: str, state: str, timeout_s: float = 20.0) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        job = stack.coordinator.job(job_id)
        return job if job["cleanup_state"] == state else None

    return wait_until(reached, timeout_s=timeout_s, what=f"job {job_id}'s cleanup to be {state}")


# --- the main cycle -----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["eager", "deferred"])
def test_scaling_2_4_3_2_serves_correctly_and_reports_the_downtime_the_client_saw(
    stack: Stack, policy: str
) -> None:
    client = client_for(stack)
    jobs = []
    try:
        client.wait_serving()
        for target in (4, 3, 2):
            job = stack.scale_to(target, warmup_policy=policy)
            assert job["state"] == "succeeded", job
            assert job["warmup_policy"] == policy
            assert stack.size() == target
            members = [m["url"] for m in stack.coordinator.members(job)]
            assert len(members) == target
            stack.assert_outputs_correct(members)
            jobs.append(job)
            client.wait_serving()  # served again before the next job's stop
    finally:
        client.stop()

    windows = [w for w in (downtime_window(j) for j in jobs) if w is not None]
    assert len(windows) == 3
    outside = [
        s
        for s in client.failures()
        if not any(s.sent_at <= e + WINDOW_MARGIN_S and s.done_at >= b - WINDOW_MARGIN_S for b, e in windows)
    ]
    assert outside == [], f"client requests failed outside every commit window: {outside[:3]}"
    assert all(s.max_abs_error is not None and s.max_abs_error < 1e-4 for s in client.samples if s.ok)
    # The client's own resolution: a request stalled by the pause still needs one step and one
    # response after the resume. On a quiet machine it is a few ms; under heavy load, far more.
    resolution = client.latency_ms(0.9, outside_of=windows)
    for job, (start, end) in zip(jobs, windows, strict=True):
        reported = float(job["downtime_ms"])
        seen = client.outage_covering(start, end)
        print(
            f"{stack.backend} {policy} {job['from_dp_size']}->{job['to_dp_size']}: job downtime "
            f"{reported:.1f} ms, client outage {seen:.1f} ms (client request p90 {resolution:.1f} ms), "
            f"per engine {job['downtime']['per_engine_ms']}, coordinator {job['downtime'].get('coordinator')}"
        )
        # The client saw the whole stop the job reports. How much more it sees is a timing figure, so
        # it is measured, with its target and verdict, by benchmarks/downtime.py ("outside client's
        # gap at the window - job downtime_ms"), not asserted here: on 2 loaded cores a first step on
        # the new group can take 100+ ms (seen: 165 ms gap for a 13 ms stop, client p90 40 ms).
        bound = GAP_SLACK_MS + GAP_SLACK_RATIO * reported
        assert seen >= reported - bound, (reported, seen)


def test_anonymous_calls_to_the_agents_are_refused_and_neither_serving_nor_a_job_notices(
    stack: Stack,
) -> None:
    """The issue's attacks, with no credential, against the live deployment's agents: the broken
    notice, a pause with an hour's lease, an abort, and the read of its internals; then aborts and
    broken notices fired at every engine while a real 2 -> 3 job runs. All refused (401, then 429 once
    the attacker's address ran out of failures: it is the coordinator's address too, whose key keeps
    working, on the joiner as well), every request of a steady client answered outside the job's commit
    window, the job succeeds."""
    client = client_for(stack)
    answers: list[tuple[str, int]] = []
    try:
        client.wait_serving()
        generation = int(stack.coordinator.deployment()["generation"])
        for url in stack.base:
            for method, path, body in (
                ("GET", "/v1/info", None),
                ("POST", "/v1/generation/broken", {"generation": generation, "reason": "anonymous"}),
                ("POST", "/v1/reconfig/pause", {"job_id": "x", "lease_s": 3600}),
                ("POST", "/v1/reconfig/abort", {"job_id": "x"}),
            ):
                answer = httpx.request(method, f"{url}{path}", json=body, timeout=5)
                answers.append((f"{method} {path}", answer.status_code))
        job_id = stack.coordinator.scale(3)
        done = threading.Event()

        def attack() -> None:
            while not done.is_set():
                for engine in stack.coordinator.engines():
                    for path, body in (
                        ("/v1/reconfig/abort", {"job_id": job_id}),
                        ("/v1/generation/broken", {"generation": generation, "reason": "anonymous"}),
                    ):
                        with contextlib.suppress(httpx.TransportError):  # a joiner still starting
                            answer = httpx.post(f"{engine['url']}{path}", json=body, timeout=5)
                            answers.append((path, answer.status_code))

        attacker = threading.Thread(target=attack, daemon=True)
        attacker.start()
        try:
            job = stack.coordinator.wait_job(job_id)
        finally:
            done.set()
            attacker.join(timeout=30)
        client.wait_serving()
    finally:
        client.stop()
    assert job["state"] == "succeeded", job
    assert len(answers) > 8 and {status for _, status in answers} <= {401, 429}, answers[:10]
    assert answers[0][1] == 401
    window = downtime_window(job)
    outside = [
        s
        for s in client.failures()
        if window is None
        or not (s.sent_at <= window[1] + WINDOW_MARGIN_S and s.done_at >= window[0] - WINDOW_MARGIN_S)
    ]
    assert outside == [], f"client requests failed outside the commit window: {outside[:3]}"
    stack.assert_outputs_correct([m["url"] for m in stack.coordinator.members(job)])


def test_a_rotated_agent_key_reaches_the_live_agents_and_the_next_job_uses_it(stack: Stack) -> None:
    """The rotation pushes the new key to every live engine; a job after it runs on the new key (its
    joiner launched with both), and the harness's old key still opens the agents for the overlap."""
    rotated = stack.coordinator.api.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": 3600})
    assert rotated.status_code == 200, rotated.text
    body = rotated.json()
    live = {e["id"] for e in stack.coordinator.engines() if e["state"] != "left"}
    assert set(body["pushed_to"]) == live and body["not_pushed"] == {}, body
    job = stack.scale_to(3)
    assert job["state"] == "succeeded", job
    new = {"Authorization": f"Bearer {body['key']}"}
    for member in stack.coordinator.members(job):
        assert httpx.get(f"{member['url']}/v1/info", headers=new, timeout=5).status_code == 200
        assert agent_http.get(f"{member['url']}/v1/info").status_code == 200  # the overlap
        assert httpx.get(f"{member['url']}/v1/info", timeout=5).status_code == 401


def test_every_phase_has_a_start_and_an_end_and_progress_reaches_100(stack: Stack) -> None:
    job = stack.scale_to(3)
    assert job["state"] == "succeeded", job
    assert set(job["phases"]) == {"preparing", "syncing", "committing", "cleaning_up"}
    assert all(p["started_at"] and p["ended_at"] for p in job["phases"].values())
    assert job["progress"] == {"step": "done", "percent": 100.0}
    detail = stack.coordinator.job(job["id"])
    kinds = {
        e["kind"] for e in stack.coordinator.api.get(f"/v1/reconfigurations/{job['id']}").json()["events"]
    }
    assert {"transition", "plan", "progress"} <= kinds, kinds
    assert detail["engine_results"] and all(r["phase"] == "committed" for r in detail["engine_results"])


def test_a_window_over_the_downtime_budget_ends_rolled_back_naming_the_engine_and_its_part(
    stack: Stack,
) -> None:
    """Engine-agreed commit, deferred warm-up inside the window, a 1 ms budget: every engine goes back,
    and the error names the participant that overran."""
    before = stack.coordinator.deployment()
    job = stack.scale_to(3, warmup_policy="deferred", max_downtime_ms=1)
    assert job["state"] == "rolled_back", job
    assert job["commit"] == "engines" and job["max_downtime_ms"] == 1
    assert job["error"]["type"] == "downtime-budget-exceeded"
    # Deferred warm-up runs inside the window on every participant, so the joiner may overrun first.
    participants = {r["engine_id"] for r in job["engine_results"]}
    assert job["error"]["engine_id"] in participants, (job["error"], participants)
    assert re.search(r"stopped [0-9.]+ ms in its (warm_up|window)", job["error"]["message"]), job["error"]
    overrun = job["error"]["overrun"]  # the same, as fields
    assert overrun["engine_id"] == job["error"]["engine_id"] and overrun["part"] in ("warm_up", "window")
    assert overrun["budget_ms"] == 1 and overrun["stopped_ms"] > 1
    assert job["downtime_ms"] > 0  # what the overrun cost is on record
    after = stack.coordinator.deployment()
    assert (after["current_dp_size"], after["generation"]) == (
        before["current_dp_size"],
        before["generation"],
    )
    stack.assert_outputs_correct(stack.base)


# --- failure before commit ----------------------------------------------------------------------------


def test_an_agent_killed_during_prepare_rolls_back_without_a_failed_request(stack: Stack) -> None:
    coordinator = stack.coordinator
    hang_prepare_on(stack.base[0])  # keeps prepare open while we kill the joiner
    client = client_for(stack)
    try:
        job_id = coordinator.scale(3)
        planned = wait_job_has_plan(stack, job_id)
        joiner = next(r for r in planned["engine_results"] if r["role"] == "joining")
        wait_agent_at(stack.base[0], job_id, "transfer")  # the hang holds prepare open here
        wait_agent_at(joiner["url"], job_id)
        os.kill(agent_info(joiner["url"])["pid"], signal.SIGKILL)
        job = coordinator.wait_job(job_id)
    finally:
        client.stop()
    assert job["state"] == "rolled_back", job
    assert job["error"]["phase"] == "preparing"
    assert job["error"]["engine_id"] == joiner["engine_id"]
    assert job["downtime_ms"] == 0.0
    assert client.failures() == []
    assert stack.size() == 2
    stack.assert_outputs_correct(stack.base)


def test_cancel_during_prepare_ends_cancelled_and_changes_nothing(stack: Stack) -> None:
    coordinator = stack.coordinator
    before = coordinator.deployment()
    hang_prepare_on(stack.base[0])
    job_id = coordinator.scale(3)
    planned = wait_job_has_plan(stack, job_id)
    wait_agent_at(stack.base[0], job_id, "transfer")  # the hang holds prepare open here
    assert planned["state"] in ("pending", "preparing")
    response = coordinator.api.post(f"/v1/reconfigurations/{job_id}/cancel")
    assert response.status_code in (200, 202), response.text
    job = coordinator.wait_job(job_id)
    assert job["state"] == "cancelled", job
    after = coordinator.deployment()
    assert (after["current_dp_size"], after["generation"]) == (
        before["current_dp_size"],
        before["generation"],
    )
    assert all(agent_info(url)["state"] == "serving" for url in stack.base)
    stack.assert_outputs_correct(stack.base)


# --- cleanup failures ---------------------------------------------------------------------------------


def test_a_cleanup_failure_shows_on_its_job_blocks_the_next_and_retry_clears_it(stack: Stack) -> None:
    coordinator = stack.coordinator
    failing = stack.base[1]
    failing_id = agent_info(failing)["engine_id"]
    response = agent_http.post(f"{failing}/v1/faults", json={"fail_next_cleanup": True}, timeout=5)
    assert response.status_code == 200
    job = stack.scale_to(3)
    assert job["state"] == "succeeded", job["error"]
    job = wait_cleanup(stack, job["id"], "failed")
    assert job["cleanup"]["failed_engine_id"] == failing_id

    refused = coordinator.request_scale(2)
    assert refused.status_code == 409
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert job["id"] in refused.text

    retried = coordinator.api.post(f"/v1/reconfigurations/{job['id']}/cleanup/retry")
    assert retried.status_code == 200, retried.text
    wait_cleanup(stack, job["id"], "succeeded")
    assert stack.scale_to(2)["state"] == "succeeded"


def test_an_acknowledged_cleanup_failure_unblocks_the_deployment(stack: Stack) -> None:
    coordinator = stack.coordinator
    response = agent_http.post(f"{stack.base[0]}/v1/faults", json={"fail_next_cleanup": True}, timeout=5)
    assert response.status_code == 200
    job = stack.scale_to(3)
    assert job["state"] == "succeeded", job["error"]
    job = wait_cleanup(stack, job["id"], "failed")
    acknowledged = coordinator.api.post(f"/v1/reconfigurations/{job['id']}/cleanup/acknowledge")
    assert acknowledged.status_code == 200, acknowledged.text
    assert acknowledged.json()["cleanup_state"] == "acknowledged"
    assert agent_info(stack.base[0])["cleanup"]["state"] != "failed"
    assert stack.scale_to(2)["state"] == "succeeded"


# --- concurrency --------------------------------------------------------------------------------------


def test_two_concurrent_scale_requests_make_one_job_and_one_409(stack: Stack) -> None:
    coordinator = stack.coordinator
    barrier = threading.Barrier(2)
    answers: list[httpx.Response] = []

    def ask(target: int) -> None:
        with httpx.Client(base_url=coordinator.url, headers=coordinator.api.headers, timeout=10) as http:
            barrier.wait()
            answers.append(
                http.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": target})
            )

    threads = [threading.Thread(target=ask, args=(t,)) for t in (3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(a.status_code for a in answers)
    assert codes == [202, 409], [a.text for a in answers]
    accepted = next(a for a in answers if a.status_code == 202).json()
    refused = next(a for a in answers if a.status_code == 409)
    assert accepted["id"] in refused.text
    assert coordinator.wait_job(accepted["id"])["state"] == "succeeded"


# --- coordinator crashes ------------------------------------------------------------------------------

# Where the coordinator dies, and how the restarted one must end the job, with real engines. The points
# the runner decides alone (synced, paused, switched, cleaning_up) are specified in-process against fake
# agents (`tests/runner/test_recovery.py`), and "paused" once more here on Postgres below; these are the
# points where the engines' own behaviour decides: a prepared generation aborted by real agents, and the
# engine-agreed commit ("arming": one engine armed, the rest not yet, and the restarted coordinator arms
# them so the commit goes on; "armed": the engines finish the switch without the coordinator and the
# restarted one records it).
CRASH_POINTS = [
    pytest.param("prepared", "rolled_back", "engines", id="prepared"),
    pytest.param("arming", "succeeded", "engines", id="arming"),
    pytest.param("armed", "succeeded", "engines", id="armed"),
]


@pytest.mark.parametrize(("point", "outcome", "commit"), CRASH_POINTS)
def test_a_coordinator_killed_mid_job_is_reconciled_after_restart(
    stack: Stack, point: str, outcome: str, commit: str
) -> None:
    assert_reconciled_after_a_crash_at(stack, point, outcome, commit=commit)


@pytest.mark.databases("postgres")
def test_on_postgres_a_coordinator_killed_with_engines_paused_is_reconciled_after_restart(
    stack: Stack,
) -> None:
    """The one e2e case on Postgres: leases, recovery and the resume of paused engines there."""
    assert_reconciled_after_a_crash_at(stack, "paused", "rolled_back", commit="coordinator")


def assert_reconciled_after_a_crash_at(stack: Stack, point: str, outcome: str, *, commit: str) -> None:
    coordinator = stack.coordinator
    coordinator.kill()
    # The armed engine must still be waiting when the successor looks (not have timed out its arm,
    # whatever the restart costs on a loaded machine): the arm deadline travels with the arm.
    coordinator.start(EPCTL_RUNNER_TEST_HANG_AT=point, EPCTL_RUNNER_ARM_DEADLINE_S="120")
    try:
        job_id = coordinator.scale(3, commit=commit)
        assert coordinator.wait_marker() == point
    finally:
        coordinator.kill()
    coordinator.start()
    job = coordinator.wait_job(job_id, timeout_s=60)
    assert job["state"] == outcome, job

    deployment = coordinator.deployment()
    engines = [e for e in coordinator.engines() if e["state"] != "left"]
    infos = [agent_info(e["url"]) for e in engines]
    serving = [i for i in infos if i["state"] == "serving"]
    assert all(i["state"] != "paused" for i in infos), infos
    assert deployment["current_dp_size"] == len(serving)
    assert all(i["generation"] == deployment["generation"] for i in serving)
    stack.assert_outputs_correct([i["url"] for i in serving])


# --- a switch failing part-way ------------------------------------------------------------------------


def test_a_switch_failing_part_way_fails_the_job_and_degrades_the_deployment(stack: Stack) -> None:
    """On a deployment of its own (a degraded deployment is not what the other tests start from), kept
    small on these 2 cores: one engine, then a joiner whose switch succeeds while the member's fails."""
    coordinator = stack.coordinator
    name = f"split-{uuid.uuid4().hex[:6]}"
    coordinator.create_deployment(name)
    try:
        launched = stack.scale_to(1, name)
        assert launched["state"] == "succeeded", launched["error"]
        (failing,) = coordinator.members(launched)
        response = agent_http.post(f"{failing['url']}/v1/faults", json={"fail_next_switch": True}, timeout=5)
        assert response.status_code == 200
        before = coordinator.deployment(name)
        job = stack.scale_to(2, name)
        assert job["state"] == "failed", (job["state"], job["error"])
        assert job["error"]["phase"] == "committing"
        assert job["error"]["engine_id"] == failing["engine_id"]
        assert coordinator.deployment(name)["status"] == "degraded"
        by_engine = {r["engine_id"]: r for r in job["engine_results"]}
        # The job shows which engine is on which generation.
        assert by_engine[failing["engine_id"]]["agent"]["generation"] == before["generation"]
        switched = [r for r in job["engine_results"] if r["agent"]["generation"] == before["generation"] + 1]
        assert switched, job["engine_results"]
    finally:
        LocalLauncher(coordinator.data_dir).stop_all(deployment=name)
