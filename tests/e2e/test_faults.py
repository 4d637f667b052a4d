"""A crash, on real processes: an engine SIGKILLed outside a job. The one real-process test of that
boundary; every rule it passes through is a row of the liveness judge's table
(tests/runner/test_liveness_rules.py: a gone process found before its heartbeat timeout, the status and
its reason, the write-off, the shrink to the survivors, the grow-back of `replace`, the recovery figures)
and is written and run on fake agents in tests/runner/test_selfheal.py. The frozen engine is
tests/e2e/test_engines_outlive_the_coordinator.py's; the cut and the whole host are tests/hosts'.

It runs on a deployment of its own (a broken deployment is not what the other e2e tests start from) and
stops its engines at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

from app.launchers.local import LocalLauncher
from tests.support.e2e import Stack
from tests.support.invariants import assert_recovered
from tests.support.stack import ENGINE, agent_info
from tests.support.waiting import wait_until


@contextlib.contextmanager
def own_deployment(
    stack: Stack, on_engine_loss: str, size: int = 2, **fields: Any
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    coordinator = stack.coordinator
    name = f"faults-{uuid.uuid4().hex[:6]}"
    coordinator.create_deployment(name, on_engine_loss=on_engine_loss, **fields)
    try:
        job = stack.scale_to(size, name)
        assert job["state"] == "succeeded", job["error"]
        yield name, coordinator.members(job)
    finally:
        LocalLauncher(coordinator.data_dir).stop_all(deployment=name)


def test_a_deployment_that_lost_an_engine_heals_by_itself(stack: Stack) -> None:
    """SIGKILL of rank 1: the deployment degrades (an incident says why and names the engine), a
    self-heal job forms a new generation on the survivor, and a second one launches an engine and grows
    the deployment back to two (`replace`)."""
    coordinator = stack.coordinator
    with own_deployment(stack, "replace") as (name, members):
        before = coordinator.deployment(name)
        os.kill(int(agent_info(members[1]["url"])["pid"]), signal.SIGKILL)
        size = 2

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
            what=f"deployment {name} to heal and grow back",
            interval_s=0.3,
            describe=lambda: f"{coordinator.deployment(name)}\n{coordinator.engines(name)}",
        )
        jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name, "limit": 10}).json()[
            "data"
        ]
        healing = [j for j in jobs if j["requested_by"] == "self-heal"]
        # An attempt may roll back (a survivor still leaving the broken group) and be tried again.
        succeeded = [j for j in healing if j["state"] == "succeeded"]
        assert len(succeeded) == 2, healing  # the shrink to the survivor, the grow-back
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
        # The outage is on a record: one incident, why, which engine, resolved by the heal.
        (incident,) = coordinator.api.get("/v1/incidents", params={"deployment": name}).json()["data"]
        assert incident["reason"] in ("members-missing", "engine-unreachable"), incident
        assert members[1]["engine_id"] in incident["engines"] and incident["state"] == "resolved", incident


def test_a_covered_loss_serves_from_what_the_survivors_hold(stack: Stack) -> None:
    """Three engines, every expert on two of them (redundant slots, coverage placement): SIGKILL of
    rank 2, and the self-heal shrink re-forms the group on the two survivors from the rows they kept:
    not one weight byte loads from the checkpoint or crosses the network, and the outputs are exact."""
    coordinator = stack.coordinator
    covered = ENGINE.model_copy(update={"num_redundant_experts": ENGINE.num_logical_experts})
    with own_deployment(stack, "shrink", 3, engine=covered.model_dump()) as (name, members):
        before = coordinator.deployment(name)
        assert before["coverage"]["covered"], before["coverage"]
        os.kill(int(agent_info(members[2]["url"])["pid"]), signal.SIGKILL)

        def shrunk() -> dict[str, Any] | None:
            deployment = coordinator.deployment(name)
            whole = deployment["status"] == "ready" and deployment["active_job_id"] is None
            return deployment if whole and deployment["generation"] > before["generation"] else None

        wait_until(
            shrunk,
            timeout_s=120,
            what=f"deployment {name} to serve on the survivors",
            interval_s=0.3,
            describe=lambda: f"{coordinator.deployment(name)}\n{coordinator.engines(name)}",
        )
        jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name, "limit": 10}).json()[
            "data"
        ]
        (heal, *_) = [j for j in jobs if j["requested_by"] == "self-heal" and j["state"] == "succeeded"]
        assert heal["to_dp_size"] == 2 and heal["time_to_serving_ms"] is not None, heal
        plan = heal["placement"]
        assert (plan["copies_moved"], plan["bytes_moved"], plan["source"]) == (0, 0, "resident"), plan
        for result in heal["engine_results"]:
            moved = (result["bytes_loaded"], result["bytes_received"], result["transfer_backend"])
            assert moved == (0, 0, None), result
            assert result["bytes_resident"] == result["bytes_moved"] > 0, result
        serving = [e["url"] for e in coordinator.engines(name) if e["state"] == "serving"]
        assert len(serving) == 2
        stack.assert_outputs_correct(serving)


def test_a_loss_heals_onto_a_warm_spare_and_a_new_spare_is_launched(stack: Stack) -> None:
    """Two engines and one warm spare (issue 38): the spare is launched and holds every expert before
    the loss; SIGKILL of rank 1, and one self-heal job takes the spare straight back to two engines,
    on the broken generation's placement (the spare on the lost rank's rows): not one weight byte loads
    or crosses the network, the outputs are exact, and a new spare is launched behind it."""
    coordinator = stack.coordinator
    with own_deployment(stack, "shrink", 2, spares=1) as (name, members):

        def warm_spare(not_this: str | None = None) -> dict[str, Any] | None:
            spares = [
                e for e in coordinator.engines(name) if e.get("role") == "spare" and e["id"] != not_this
            ]
            if not spares or agent_info(spares[0]["url"]).get("spare_bytes", 0) <= 0:
                return None
            return spares[0]

        spare = wait_until(warm_spare, timeout_s=120, what="a warm spare", interval_s=0.3)
        assert coordinator.deployment(name)["spare_engines"] == [spare["id"]]
        before = coordinator.deployment(name)
        os.kill(int(agent_info(members[1]["url"])["pid"]), signal.SIGKILL)

        def whole() -> dict[str, Any] | None:
            deployment = coordinator.deployment(name)
            ready = deployment["status"] == "ready" and deployment["active_job_id"] is None
            newer = deployment["generation"] > before["generation"]
            return deployment if ready and newer and deployment["current_dp_size"] == 2 else None

        wait_until(
            whole,
            timeout_s=120,
            what=f"deployment {name} back to two engines on its spare",
            interval_s=0.3,
            describe=lambda: f"{coordinator.deployment(name)}\n{coordinator.engines(name)}",
        )
        jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name, "limit": 10}).json()[
            "data"
        ]
        (heal,) = [j for j in jobs if j["requested_by"] == "self-heal" and j["state"] == "succeeded"]
        assert (heal["from_dp_size"], heal["to_dp_size"]) == (2, 2) or heal["to_dp_size"] == 2, heal
        plan = heal["placement"]
        assert (plan["copies_moved"], plan["bytes_moved"], plan["source"]) == (0, 0, "spare"), plan
        for result in heal["engine_results"]:
            moved = (result["bytes_loaded"], result["bytes_received"], result["transfer_backend"])
            assert moved == (0, 0, None), result
            assert result["bytes_resident"] == result["bytes_moved"] > 0, result
        serving = [e for e in coordinator.engines(name) if e["state"] == "serving"]
        assert {e["id"] for e in serving} == {members[0]["engine_id"], spare["id"]}
        stack.assert_outputs_correct([e["url"] for e in serving])
        # The spare's place is taken again by a new one, launched in the background.
        again = wait_until(lambda: warm_spare(not_this=spare["id"]), timeout_s=120, what="a new warm spare")
        assert again["id"] not in {members[0]["engine_id"], members[1]["engine_id"], spare["id"]}
