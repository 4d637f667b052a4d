"""Faults injected into real engines: the deployment's recorded status follows what the engines report.

Each test runs on a deployment of its own (a broken deployment is not what the other e2e tests start
from) and stops its engines at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from app.launchers.local import LocalLauncher
from tests.e2e.conftest import Stack
from tests.support.invariants import assert_recovered
from tests.support.stack import agent_http, agent_info
from tests.support.waiting import wait_until


@pytest.fixture
def own(stack: Stack) -> Iterator[tuple[Stack, str, list[dict[str, Any]]]]:
    """A deployment of two serving engines of its own that only reports a lost engine (`on_engine_loss:
    none`): (stack, its name, its members in rank order)."""
    with own_deployment(stack, "none") as (name, members):
        yield stack, name, members


@contextlib.contextmanager
def own_deployment(stack: Stack, on_engine_loss: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    coordinator = stack.coordinator
    name = f"faults-{uuid.uuid4().hex[:6]}"
    coordinator.create_deployment(name, on_engine_loss=on_engine_loss)
    try:
        job = stack.scale_to(2, name)
        assert job["state"] == "succeeded", job["error"]
        yield name, coordinator.members(job)
    finally:
        LocalLauncher(coordinator.data_dir).stop_all(deployment=name)


def wait_status(stack: Stack, name: str, status: str, timeout_s: float = 30.0) -> dict[str, Any]:
    coordinator = stack.coordinator

    def reached() -> dict[str, Any] | None:
        deployment = coordinator.deployment(name)
        # Degraded and saying why: the heartbeat expiry marks a member's deployment degraded at once, and
        # the health pass right after it writes the reason.
        explained = status != "degraded" or deployment["status_detail"] is not None
        return deployment if deployment["status"] == status and explained else None

    return wait_until(
        reached,
        timeout_s=timeout_s,
        what=f"deployment {name} to be {status}",
        interval_s=0.2,
        describe=lambda: f"{coordinator.deployment(name)}\n{coordinator.engines(name)}",
    )


def test_a_killed_member_degrades_its_deployment_within_seconds(
    own: tuple[Stack, str, list[dict[str, Any]]],
) -> None:
    stack, name, members = own
    assert stack.coordinator.deployment(name)["status"] == "ready"
    victim = agent_info(members[1]["url"])
    os.kill(int(victim["pid"]), signal.SIGKILL)
    deployment = wait_status(stack, name, "degraded")
    detail = deployment["status_detail"]
    # The survivor's group broke at once (members-missing), or the dead engine's heartbeats stopped first.
    assert detail["reason"] in ("members-missing", "engine-unreachable"), detail
    assert f"of 2 engines serve generation {deployment['generation']}" in detail["message"]


def test_a_frozen_member_degrades_its_deployment_and_cannot_hold_the_others(
    own: tuple[Stack, str, list[dict[str, Any]]],
) -> None:
    """Frozen past the serving collective deadline (EPCTL_RUNNER_SERVING_COLLECTIVE_S, 5 s): the other
    member leaves the group instead of waiting for it; thawed, the frozen one finds its group broken
    too, so nobody serves the old generation (no split brain). `none`: the operator acts."""
    stack, name, members = own
    generation = stack.coordinator.deployment(name)["generation"]
    frozen = int(agent_info(members[1]["url"])["pid"])
    os.kill(frozen, signal.SIGSTOP)
    try:
        deployment = wait_status(stack, name, "degraded")
        # engine-stalled: the other member left the group at the serving deadline and named it.
        reasons = ("engine-unreachable", "members-missing", "engine-stalled")
        assert deployment["status_detail"]["reason"] in reasons
        wait_until(
            lambda: agent_info(members[0]["url"])["generation"] == 0,
            timeout_s=30,
            what="the other member to leave the group",
            interval_s=0.2,
        )
    finally:
        os.kill(frozen, signal.SIGCONT)

    def both_left() -> list[dict[str, Any]] | None:
        infos = [agent_info(m["url"]) for m in members]
        return infos if all(i["generation"] == 0 for i in infos) else None

    infos = wait_until(
        both_left,  # the other member left already: wait for the thawed one too
        timeout_s=30,
        what="the thawed member to find its group broken",
        interval_s=0.2,
    )
    assert [(i["state"], i["generation"]) for i in infos] == [("idle", 0), ("idle", 0)], infos
    deployment = stack.coordinator.deployment(name)
    assert (deployment["status"], deployment["generation"]) == ("degraded", generation)


def test_a_group_broken_under_live_engines_is_re_formed_at_its_size(stack: Stack) -> None:
    """Both members give their group up (each told it broke) but keep heartbeating: self-healing forms
    a new generation on them at the same size, with no engine lost."""
    coordinator = stack.coordinator
    with own_deployment(stack, "shrink") as (name, members):
        before = coordinator.deployment(name)
        for member in members:
            notice = {"generation": before["generation"], "reason": "test", "reporter": "e2e"}
            response = agent_http.post(f"{member['url']}/v1/generation/broken", json=notice)
            assert response.status_code == 200, response.text

        def reformed() -> dict[str, Any] | None:
            deployment = coordinator.deployment(name)
            ready = deployment["status"] == "ready" and deployment["active_job_id"] is None
            return deployment if ready and deployment["generation"] > before["generation"] else None

        deployment = wait_until(
            reformed,
            timeout_s=120,
            what=f"deployment {name} re-formed",
            interval_s=0.3,
            describe=lambda: f"{coordinator.deployment(name)}\n{coordinator.engines(name)}",
        )
        assert deployment["current_dp_size"] == 2
        jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name, "limit": 5}).json()
        healing = [j for j in jobs["data"] if j["requested_by"] == "self-heal"]
        assert healing and healing[0]["state"] == "succeeded" and healing[0]["to_dp_size"] == 2, healing
        assert healing[0]["time_to_serving_ms"] is not None
        stack.assert_outputs_correct([m["url"] for m in members])
        assert_recovered(stack, name)


@pytest.mark.parametrize("on_engine_loss", ["shrink", "replace"])
def test_a_deployment_that_lost_an_engine_heals_by_itself(stack: Stack, on_engine_loss: str) -> None:
    """SIGKILL of rank 1: a self-heal job forms a new generation on the survivor (`shrink`), and with
    `replace` a second one launches an engine and grows the deployment back to two."""
    coordinator = stack.coordinator
    with own_deployment(stack, on_engine_loss) as (name, members):
        before = coordinator.deployment(name)
        os.kill(int(agent_info(members[1]["url"])["pid"]), signal.SIGKILL)
        size = 1 if on_engine_loss == "shrink" else 2

        def healed() -> dict[str, Any] | None:
            deployment = coordinator.deployment(name)
            whole = deployment["status"] == "ready" and deployment["status_detail"] is None
            whole = whole and deployment["active_job_id"] is None  # and the recovery was announced
            return deployment if whole and deployment["generation"] > before["generation"] else None

        def grown() -> dict[str, Any] | None:
            deployment = healed()
            return deployment if deployment and deployment["current_dp_size"] == size else None

        deployment = wait_until(
            grown,
            timeout_s=120,
            what=f"deployment {name} to heal ({on_engine_loss})",
            interval_s=0.3,
            describe=lambda: f"{coordinator.deployment(name)}\n{coordinator.engines(name)}",
        )
        jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name, "limit": 10}).json()[
            "data"
        ]
        healing = [j for j in jobs if j["requested_by"] == "self-heal"]
        # An attempt may roll back (a survivor still leaving the broken group) and be tried again.
        succeeded = [j for j in healing if j["state"] == "succeeded"]
        assert len(succeeded) == (1 if on_engine_loss == "shrink" else 2), healing
        assert all(j["state"] in ("succeeded", "rolled_back", "failed") for j in healing), healing
        # The recovery figures are on the job's record, counted from the lost engine's last heartbeat.
        first = succeeded[-1]  # newest first: the last one listed is the shrink
        assert first["loss_at"] is not None and first["time_to_detect_ms"] is not None
        assert first["time_to_serving_ms"] >= first["time_to_detect_ms"]
        assert deployment["status_detail"] is None
        serving = [e for e in coordinator.engines(name) if e["state"] == "serving"]
        assert len(serving) == size and members[1]["engine_id"] not in {e["id"] for e in serving}
        stack.assert_outputs_correct([e["url"] for e in serving])
        assert_recovered(stack, name)
