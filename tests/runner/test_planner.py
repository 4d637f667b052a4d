"""The plan of a reconfiguration, from what the agents report."""

from __future__ import annotations

import pytest

from app.backends.reference.planner import (
    DeploymentSpec,
    JobOptions,
    PlanError,
    choose_transfer_backend,
    make_plan,
    resolve_warmup_policy,
)
from engine_agent.placement import validate_placement
from engine_agent.protocol import (
    AgentInfo,
    AgentState,
    CleanupState,
    CleanupStatus,
    EngineConfig,
    Platform,
    Role,
    StoreAddress,
    TransferBackend,
    WarmupPolicy,
)

ENGINE = EngineConfig(num_logical_experts=8, hidden_size=32, intermediate_size=64)


def agent(
    engine_id: str,
    *,
    rank: int | None,
    generation: int,
    world: int = 0,
    load: list[int] | None = None,
    platform: Platform = Platform.cpu,
    backends: tuple[TransferBackend, ...] = (TransferBackend.nixl, TransferBackend.gloo),
    port: int = 29500,
) -> AgentInfo:
    return AgentInfo(
        engine_id=engine_id,
        url=f"http://127.0.0.1:{port}",
        pid=1,
        platform=platform,
        device="cpu",
        state=AgentState.idle if rank is None else AgentState.serving,
        generation=generation,
        rank=rank,
        world_size=world,
        warmup_policy=None,
        placement=[[0, 1, 2, 3], [4, 5, 6, 7]] if rank is not None else [],
        engine=ENGINE,
        store=StoreAddress(host="127.0.0.1", port=port + 1000),
        transfer_backends=list(backends),
        serving_steps=0,
        requests_served=0,
        expert_load=load or [0] * 8,
        free_kv_bytes=1 << 20,
        cleanup=CleanupStatus(state=CleanupState.idle),
    )


DEPLOYMENT = DeploymentSpec(name="demo", num_logical_experts=8, num_redundant_experts=0, generation=3)
TWO = [agent("e0", rank=0, generation=3, world=2, port=1), agent("e1", rank=1, generation=3, world=2, port=2)]


def test_scale_up_keeps_existing_ranks_and_appends_joiners() -> None:
    idle = [agent("j0", rank=None, generation=0, port=3), agent("j1", rank=None, generation=0, port=4)]
    plan = make_plan(DEPLOYMENT, TWO + idle, 4)
    assert [m.engine_id for m in plan.members] == ["e0", "e1", "j0", "j1"]
    assert [m.engine_id for m in plan.old_members] == ["e0", "e1"]
    assert plan.joiners == ["j0", "j1"] and plan.leavers == []
    assert (plan.old_generation, plan.generation) == (3, 4)
    assert plan.role("j0") == Role.joining and plan.role("e1") == Role.staying


def test_scale_up_takes_only_as_many_joiners_as_needed() -> None:
    idle = [agent("j0", rank=None, generation=0, port=3), agent("j1", rank=None, generation=0, port=4)]
    plan = make_plan(DEPLOYMENT, TWO + idle, 3)
    assert plan.joiners == ["j0"]
    assert [m.engine_id for m in plan.participants] == ["e0", "e1", "j0"]


def test_scale_down_removes_highest_ranks_by_default() -> None:
    three = [*TWO, agent("e2", rank=2, generation=3, world=3, port=3)]
    plan = make_plan(DEPLOYMENT, three, 2)
    assert plan.leavers == ["e2"]
    assert [m.engine_id for m in plan.members] == ["e0", "e1"]


def test_scale_down_retires_the_named_engines_and_renumbers_the_others_compactly() -> None:
    three = [*TWO, agent("e2", rank=2, generation=3, world=3, port=3)]
    plan = make_plan(DEPLOYMENT, three, 2, JobOptions(retire=("e1",)))
    assert plan.leavers == ["e1"]
    assert [m.engine_id for m in plan.members] == ["e0", "e2"]
    assert plan.rank_map == {
        "e0": {"old": 0, "new": 0},
        "e1": {"old": 1, "new": None},
        "e2": {"old": 2, "new": 1},
    }
    assert plan.placement_record()["rank_map"] == plan.rank_map


def test_retiring_an_engine_that_no_longer_serves_is_a_plan_error() -> None:
    three = [*TWO, agent("e2", rank=2, generation=3, world=3, port=3)]
    with pytest.raises(PlanError) as caught:
        make_plan(DEPLOYMENT, three, 2, JobOptions(retire=("gone",)))
    assert caught.value.type == "retire-not-member"


def test_the_new_placement_keeps_what_survivors_hold_and_reports_copies_and_bytes() -> None:
    deployment = DeploymentSpec(
        name="demo", num_logical_experts=8, num_redundant_experts=0, generation=3, expert_nbytes=1000
    )
    three = [
        agent("e0", rank=0, generation=3, world=3, port=1),
        agent("e1", rank=1, generation=3, world=3, port=2),
        agent("e2", rank=2, generation=3, world=3, port=3),
    ]
    for info in three:
        info.placement = [[0, 1, 2], [3, 4, 5], [6, 7, 0]]
    plan = make_plan(deployment, three, 2, JobOptions(retire=("e1",)))
    validate_placement(plan.placement, 8)
    survivors_held = [{0, 1, 2}, {6, 7, 0}]
    new_pairs = [set(slots) - held for slots, held in zip(plan.placement, survivors_held, strict=True)]
    copies = int(str(plan.placement_stats["copies_moved"]))
    assert copies == sum(len(pairs) for pairs in new_pairs)
    assert copies <= 4, "survivors keep what they hold: e1's three experts and one more slot move"
    assert int(str(plan.placement_stats["bytes_moved"])) == 1000 * copies
    assert copies >= int(str(plan.placement_stats["lower_bound"])) >= 3  # e1's experts 3, 4, 5


def test_store_is_the_new_rank_zero_agents() -> None:
    idle = [agent("j0", rank=None, generation=0, port=3)]
    up = make_plan(DEPLOYMENT, TWO + idle, 3)
    assert up.members[0].engine_id == "e0" and up.store == TWO[0].store
    down = make_plan(DEPLOYMENT, TWO, 1)
    assert down.members[0].engine_id == "e0" and down.store == TWO[0].store


def test_placement_is_valid_for_the_new_size_and_follows_load() -> None:
    hot = [100, 1, 1, 1, 1, 1, 1, 1]
    members = [
        agent("e0", rank=0, generation=3, load=hot, port=1),
        agent("e1", rank=1, generation=3, load=hot, port=2),
    ]
    deployment = DeploymentSpec(name="demo", num_logical_experts=8, num_redundant_experts=4, generation=3)
    idle = [agent("j0", rank=None, generation=0, port=3), agent("j1", rank=None, generation=0, port=4)]
    plan = make_plan(deployment, members + idle, 4)
    assert len(plan.placement) == 4
    validate_placement(plan.placement, 8)
    assert plan.expert_load == [200, 2, 2, 2, 2, 2, 2, 2]
    assert sum(slots.count(0) for slots in plan.placement) > 1  # the hot expert is replicated
    assert plan.old_placement == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_first_scale_from_zero_has_no_old_generation() -> None:
    deployment = DeploymentSpec(name="demo", num_logical_experts=8, num_redundant_experts=0, generation=0)
    idle = [agent("j0", rank=None, generation=0, port=3), agent("j1", rank=None, generation=0, port=4)]
    plan = make_plan(deployment, idle, 2)
    assert plan.old_members == [] and plan.old_placement == []
    assert plan.generation == 1
    assert plan.store == idle[0].store


def test_not_enough_idle_engines_is_a_plan_error() -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(DEPLOYMENT, TWO, 3)
    assert caught.value.type == "not-enough-engines"


def test_target_equal_to_current_size_is_a_plan_error() -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(DEPLOYMENT, TWO, 2)
    assert caught.value.type == "no-change"


def test_ranks_with_a_gap_are_reported_as_inconsistent() -> None:
    gap = [agent("e0", rank=0, generation=3, port=1), agent("e2", rank=2, generation=3, port=3)]
    with pytest.raises(PlanError) as caught:
        make_plan(DEPLOYMENT, gap, 1)
    assert caught.value.type == "inconsistent-generation"


def test_auto_warmup_is_deferred_when_any_participant_is_rocm() -> None:
    assert resolve_warmup_policy("auto", None, [Platform.cuda, Platform.rocm])[0] == WarmupPolicy.deferred
    assert resolve_warmup_policy("auto", None, [Platform.cuda, Platform.cpu])[0] == WarmupPolicy.eager


def test_job_warmup_setting_overrides_the_deployments() -> None:
    assert resolve_warmup_policy("eager", "deferred", [Platform.cpu])[0] == WarmupPolicy.deferred
    assert resolve_warmup_policy("deferred", None, [Platform.cpu])[0] == WarmupPolicy.deferred
    assert resolve_warmup_policy("eager", "auto", [Platform.rocm])[0] == WarmupPolicy.eager


def test_rocm_joiner_makes_the_whole_job_deferred() -> None:
    idle = [agent("j0", rank=None, generation=0, platform=Platform.rocm, port=3)]
    plan = make_plan(DEPLOYMENT, TWO + idle, 3)
    assert plan.warmup_policy == WarmupPolicy.deferred
    assert plan.prepare_request("job-1").warmup_policy == WarmupPolicy.deferred


def test_transfer_backend_is_nixl_only_when_every_participant_offers_it() -> None:
    both = [TransferBackend.nixl, TransferBackend.gloo]
    assert choose_transfer_backend({"a": both, "b": both}) == TransferBackend.nixl
    assert choose_transfer_backend({"a": both, "b": [TransferBackend.gloo]}) == TransferBackend.gloo
