"""The tables that drive a reconfiguration on the agent (`engine_agent/reconfig/steps.py`, and the
protocol's choreography, `engine_agent/choreography.py`), the status board's rule that an abort owns
the outcome, and the refusals of a prepare request. In-process, no agents: the flows themselves run
against real agent processes in the other tests here."""

from __future__ import annotations

import time

import pytest

from engine_agent.protocol import (
    ACCEPTS,
    EngineConfig,
    Member,
    Operation,
    PrepareRequest,
    ReconfigPhase,
    ReconfigStatus,
    Role,
    StoreAddress,
    Strategy,
    TransferBackend,
    WarmupPolicy,
)
from engine_agent.reconfig.errors import Conflict, InvalidRequest
from engine_agent.reconfig.job import Job, StatusBoard
from engine_agent.reconfig.steps import ROLES, Step, steps_for
from engine_agent.reconfig.validate import validate

BUILD = [
    Step.connect_store,
    Step.agree,
    Step.create_groups,
    Step.stage_placement,
    Step.open_channel,
    Step.transfer,
]
LEAVER_BUILD = [Step.connect_store, Step.agree, Step.open_channel, Step.transfer]


@pytest.mark.parametrize(
    ("role", "strategy", "policy", "prepare", "window"),
    [
        (
            Role.staying,
            Strategy.background,
            WarmupPolicy.eager,
            [Step.wait_cleanup, *BUILD, Step.warm_up],
            [],
        ),
        (
            Role.joining,
            Strategy.background,
            WarmupPolicy.eager,
            [Step.wait_cleanup, *BUILD, Step.warm_up],
            [],
        ),
        (Role.leaving, Strategy.background, WarmupPolicy.eager, [Step.wait_cleanup, *LEAVER_BUILD], []),
        (
            Role.staying,
            Strategy.background,
            WarmupPolicy.deferred,
            [Step.wait_cleanup, *BUILD],
            [Step.warm_up],
        ),
        (Role.leaving, Strategy.background, WarmupPolicy.deferred, [Step.wait_cleanup, *LEAVER_BUILD], []),
        (Role.staying, Strategy.blocking, WarmupPolicy.eager, [Step.wait_cleanup], [*BUILD, Step.warm_up]),
        (Role.joining, Strategy.blocking, WarmupPolicy.deferred, [Step.wait_cleanup], [*BUILD, Step.warm_up]),
        (Role.leaving, Strategy.blocking, WarmupPolicy.deferred, [Step.wait_cleanup], LEAVER_BUILD),
    ],
)
def test_the_steps_of_each_role_run_where_the_strategy_and_policy_put_them(
    role: Role, strategy: Strategy, policy: WarmupPolicy, prepare: list[Step], window: list[Step]
) -> None:
    plan = steps_for(role, strategy, policy)
    assert (list(plan.prepare), list(plan.window)) == (prepare, window)


def test_no_collective_on_a_new_group_before_the_agreement() -> None:
    for role in Role:
        for strategy in Strategy:
            for policy in WarmupPolicy:
                plan = steps_for(role, strategy, policy)
                order = [*plan.prepare, *plan.window]
                assert order.index(Step.agree) < order.index(Step.open_channel)
                if Step.create_groups in order:
                    assert order.index(Step.agree) < order.index(Step.create_groups)


@pytest.mark.parametrize(
    ("strategy", "policy", "in_window"),
    [
        (Strategy.background, WarmupPolicy.eager, False),
        (Strategy.background, WarmupPolicy.deferred, True),
        (Strategy.blocking, WarmupPolicy.eager, True),
        (Strategy.blocking, WarmupPolicy.deferred, True),
    ],
)
def test_graphs_are_captured_right_after_the_warm_up_wherever_the_policy_puts_it(
    strategy: Strategy, policy: WarmupPolicy, in_window: bool
) -> None:
    for role in (Role.staying, Role.joining):
        plan = steps_for(role, strategy, policy, graphs=True)
        where = list(plan.window if in_window else plan.prepare)
        assert where[-2:] == [Step.warm_up, Step.capture_graphs]
        assert Step.capture_graphs not in (plan.prepare if in_window else plan.window)
    assert Step.capture_graphs not in [*steps_for(Role.leaving, strategy, policy, graphs=True).window]
    assert Step.capture_graphs not in [*steps_for(Role.leaving, strategy, policy, graphs=True).prepare]


def test_an_engine_without_graphs_captures_nothing() -> None:
    for role in Role:
        for strategy in Strategy:
            for policy in WarmupPolicy:
                plan = steps_for(role, strategy, policy)
                assert Step.capture_graphs not in [*plan.prepare, *plan.window]


def test_only_members_of_the_new_generation_switch_in_and_only_old_members_stop() -> None:
    assert [(r, ROLES[r].in_old, ROLES[r].in_new, ROLES[r].drains) for r in Role] == [
        (Role.joining, False, True, False),
        (Role.staying, True, True, False),
        (Role.leaving, True, False, True),
    ]


def test_each_strategy_orders_sync_pause_and_switch_its_own_way() -> None:
    background, blocking = ACCEPTS[Strategy.background], ACCEPTS[Strategy.blocking]
    assert ReconfigPhase.prepared in background[Operation.sync]  # background: sync, then pause
    assert ReconfigPhase.synced in background[Operation.pause]
    assert background[Operation.switch] == {ReconfigPhase.paused}
    assert blocking[Operation.pause] == {ReconfigPhase.prepared}  # blocking: pause, then sync
    assert blocking[Operation.sync] == {ReconfigPhase.paused}
    assert ReconfigPhase.synced in blocking[Operation.switch]


def test_each_call_starts_from_the_end_phase_of_the_call_before_it_or_before_the_optional_sync() -> None:
    P = ReconfigPhase
    assert {
        Strategy.background: {
            Operation.sync: {P.prepared},
            Operation.pause: {P.prepared, P.synced},
            Operation.switch: {P.paused},
            Operation.arm: {P.prepared, P.synced},
        },
        Strategy.blocking: {
            Operation.sync: {P.paused},
            Operation.pause: {P.prepared},
            Operation.switch: {P.paused, P.synced},
            Operation.arm: set(),  # prepare's work runs inside the pause: the coordinator commits
        },
    } == ACCEPTS


def spread(ranks: int) -> list[list[int]]:
    """Four experts over one or two ranks."""
    return [[0, 1, 2, 3]] if ranks == 1 else [[0, 1], [2, 3]]


def request(
    members: list[str],
    old_members: list[str],
    *,
    generation: int = 2,
    placement: list[list[int]] | None = None,
) -> PrepareRequest:
    return PrepareRequest(
        job_id="job-1",
        generation=generation,
        old_generation=1,
        members=[Member(engine_id=e, url=f"http://{e}") for e in members],
        old_members=[Member(engine_id=e, url=f"http://{e}") for e in old_members],
        old_placement=spread(len(old_members)),
        placement=placement if placement is not None else spread(len(members)),
        store=StoreAddress(host="127.0.0.1", port=1),
        warmup_policy=WarmupPolicy.eager,
        transfer_backend=TransferBackend.gloo,
    )


CONFIG = EngineConfig(num_logical_experts=4)


def test_an_engine_in_neither_generation_is_refused_and_a_new_one_joins() -> None:
    with pytest.raises(Conflict) as outsider:
        validate("z", request(["a", "b"], ["a"]), CONFIG, None)
    assert outsider.value.type == "not-a-participant"
    assert validate("b", request(["a", "b"], ["a"]), CONFIG, None) == Role.joining


def test_a_member_of_the_old_generation_must_serve_it() -> None:
    with pytest.raises(Conflict) as idle:
        validate("a", request(["a"], ["a"]), CONFIG, None)  # it serves nothing, the job says gen 1
    assert idle.value.type == "generation-mismatch"


def test_a_placement_that_misses_an_expert_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="invalid placement"):
        validate("b", request(["a", "b"], ["a"], placement=[[0, 1], [1, 2]]), CONFIG, None)


def job() -> Job:
    plan = steps_for(Role.staying, Strategy.background, WarmupPolicy.eager)
    status = ReconfigStatus(
        job_id="job-1",
        generation=2,
        role=Role.staying,
        phase=ReconfigPhase.preparing,
        steps_total=len(plan.prepare),
        warmup_policy=WarmupPolicy.eager,
        strategy=Strategy.background,
        updated_at=time.time(),
    )
    req = request(["a"], ["a"])
    return Job(
        me="a",
        request=req,
        role=Role.staying,
        policy=WarmupPolicy.eager,
        plan=plan,
        status=status,
        counted=plan.prepare,
    )


def test_once_aborting_a_late_step_cannot_overwrite_the_outcome() -> None:
    board, the_job = StatusBoard(), job()
    woken: list[int] = []
    board.add_watcher(lambda: woken.append(1))
    board.install(the_job)
    the_job.abort.set()
    board.update(the_job, phase=ReconfigPhase.aborting, step="abort")
    board.update(the_job, phase=ReconfigPhase.prepared, step=None, bytes_moved=7)  # a step that ended late
    status = board.snapshot()
    assert status is not None and status.phase == ReconfigPhase.aborting and status.bytes_moved == 7
    board.update(the_job, phase=ReconfigPhase.aborted)
    assert board.snapshot() is not None and board.snapshot().phase == ReconfigPhase.aborted  # type: ignore[union-attr]
    assert len(woken) == 4  # every change wakes the long-polls


def test_an_operation_that_ends_counts_all_its_steps_done() -> None:
    board, the_job = StatusBoard(), job()
    board.install(the_job)
    board.update(the_job, step=Step.agree.value, steps_done=2)
    board.update(the_job, phase=ReconfigPhase.prepared, step=None)
    status = board.snapshot()
    assert status is not None and status.steps_done == status.steps_total == len(the_job.plan.prepare)
