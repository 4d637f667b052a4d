"""The step tables that drive a reconfiguration on this agent, per role and per strategy.

What a role does (`ROLES`):

    role      in old gen  in new gen  builds the new generation with
    joining   -           yes         connect_store agree create_groups stage_placement open_channel transfer
    staying   yes         yes         connect_store agree create_groups stage_placement open_channel transfer
    leaving   yes         -           connect_store agree open_channel transfer   (it serves weights only)

A member of the old generation stops at the pause and serves the old generation again on a rollback;
a member of the new generation syncs over the new group, warms it up and switches into it at commit (a
leaver leaves instead, and goes idle). A leaver stops admitting requests at prepare and drains its
queue before it pauses.

Where the steps run (`steps_for`), per strategy and warm-up policy:

    strategy    policy     prepare (the old generation serves)             window (stopped, inside pause)
    background  eager      wait_cleanup, build..., warm_up, capture_graphs  -
    background  deferred   wait_cleanup, build...                          warm_up, capture_graphs
    blocking    either     wait_cleanup                                    build..., warm_up, capture_graphs

(warm_up and capture_graphs only for members of the new generation, capture_graphs only on an engine
that captures its step. The warm-up policy governs the capture as it governs the first collective: a
capture racing serving collectives is what a deferred platform must not risk. With an eager policy
nothing is captured inside the window.) Which call may follow which, and the phases each moves the
job through, are the protocol's (`engine_agent.choreography`: `CALLS`, `MOVES`, `ACCEPTS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from engine_agent.protocol import Role, Strategy, WarmupPolicy


class Step(StrEnum):
    """A named unit of work; the status reports the one running (`ReconfigStatus.step`), and fault
    injection names one to fail or hold (`FaultInjection.fail_prepare_at_step`)."""

    wait_cleanup = "wait_cleanup"  # the retired generation's groups are destroyed, without failure
    connect_store = "connect_store"  # the job's rendezvous store
    agree = "agree"  # warm-up policy and generation, before any collective on a new group
    create_groups = "create_groups"  # the standby EP group of the new generation
    stage_placement = "stage_placement"  # empty buffers for the experts this rank will hold
    open_channel = "open_channel"  # the weight channel over old + new participants
    transfer = "transfer"  # weights from peers, local copies, the checkpoint
    warm_up = "warm_up"  # the first collective on the new group
    capture_graphs = "capture_graphs"  # the new generation's step as CUDA graphs (`step_graphs`)


@dataclass(frozen=True)
class RoleSteps:
    """What one role does in a reconfiguration."""

    in_old: bool  # stops at the pause; serves the old generation again on a rollback
    in_new: bool  # syncs, warms up and switches into the new group (else: leaves at the switch)
    build: tuple[Step, ...]  # the steps that build its part of the new generation
    drains: bool  # stops admitting at prepare and drains its queue before the pause


_BUILD_MEMBER = (
    Step.connect_store,
    Step.agree,
    Step.create_groups,
    Step.stage_placement,
    Step.open_channel,
    Step.transfer,
)
_BUILD_SOURCE_ONLY = (Step.connect_store, Step.agree, Step.open_channel, Step.transfer)

ROLES: dict[Role, RoleSteps] = {
    Role.joining: RoleSteps(in_old=False, in_new=True, build=_BUILD_MEMBER, drains=False),
    Role.staying: RoleSteps(in_old=True, in_new=True, build=_BUILD_MEMBER, drains=False),
    Role.leaving: RoleSteps(in_old=True, in_new=False, build=_BUILD_SOURCE_ONLY, drains=True),
}


@dataclass(frozen=True)
class StepPlan:
    """The steps one engine runs for one job: in prepare, and inside the stopped window."""

    prepare: tuple[Step, ...]
    window: tuple[Step, ...]


def steps_for(role: Role, strategy: Strategy, policy: WarmupPolicy, *, graphs: bool = False) -> StepPlan:
    """The module's second table, for one engine (`graphs`: it captures its step)."""
    steps = ROLES[role]
    warm_up: tuple[Step, ...] = ()
    if steps.in_new:
        warm_up = (Step.warm_up, Step.capture_graphs) if graphs else (Step.warm_up,)
    if strategy == Strategy.blocking:
        return StepPlan(prepare=(Step.wait_cleanup,), window=steps.build + warm_up)
    if policy == WarmupPolicy.eager:
        return StepPlan(prepare=(Step.wait_cleanup, *steps.build, *warm_up), window=())
    return StepPlan(prepare=(Step.wait_cleanup, *steps.build), window=warm_up)
