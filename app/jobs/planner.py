"""The plan of one reconfiguration: who is in the new generation, where experts go, and how.

Pure: no database, no HTTP. The runner reads the deployment and asks the agents for `/v1/info`, then
calls `make_plan`; everything it sends in `prepare` comes from the returned `Plan`.

Rules:
- members keep the existing ranks' order; joiners are appended; leavers are the highest ranks
  (default) or the least-loaded engines (`leaver_choice="least_loaded"`).
- the placement is `engine_agent.placement.rebalance` over the expert load summed across the old
  members (uniform when nothing was served yet).
- the rendezvous store is the one hosted by the new rank 0's agent.
- warm-up policy: the job's setting, else the deployment's; `auto` means `deferred` if any participant
  runs on ROCm (a new RCCL communicator's first collective can deadlock against serving ones), else
  `eager`.
- transfer backend: NIXL when every participant offers it, else the gloo fallback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from engine_agent.placement import rebalance
from engine_agent.protocol import (
    AgentInfo,
    AgentState,
    LeavePolicy,
    Member,
    Platform,
    PrepareRequest,
    Role,
    StoreAddress,
    Strategy,
    Timeouts,
    TransferBackend,
    WarmupPolicy,
)

WarmupSetting = Literal["auto", "eager", "deferred"]
LeaverChoice = Literal["highest_rank", "least_loaded"]


class PlanError(Exception):
    """The reconfiguration cannot be planned from what the agents report."""

    def __init__(self, type_: str, message: str, engine_id: str | None = None) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message
        self.engine_id = engine_id


@dataclass(frozen=True)
class DeploymentSpec:
    """The parts of a deployment the planner needs (the runner builds it from the database row)."""

    name: str
    num_logical_experts: int
    num_redundant_experts: int
    generation: int  # the generation now serving (0: nothing serves yet)
    warmup_policy: WarmupSetting = "auto"


@dataclass(frozen=True)
class JobOptions:
    warmup_policy: WarmupSetting | None = None  # None: the deployment's setting
    strategy: Strategy = Strategy.background
    leave_policy: LeavePolicy = LeavePolicy.finish
    leaver_choice: LeaverChoice = "highest_rank"
    transfer_backend: TransferBackend | None = None  # None: NIXL when every participant offers it


@dataclass(frozen=True)
class Plan:
    deployment: str
    old_generation: int
    generation: int
    old_members: list[Member]
    members: list[Member]
    joiners: list[str]
    leavers: list[str]
    old_placement: list[list[int]]
    placement: list[list[int]]
    store: StoreAddress
    warmup_policy: WarmupPolicy
    warmup_reason: str
    transfer_backend: TransferBackend
    strategy: Strategy
    leave_policy: LeavePolicy
    expert_load: list[int] = field(default_factory=list)

    @property
    def from_size(self) -> int:
        return len(self.old_members)

    @property
    def to_size(self) -> int:
        return len(self.members)

    @property
    def participants(self) -> list[Member]:
        """Old members first (old rank order), then joiners: everyone who receives prepare."""
        seen = {m.engine_id for m in self.old_members}
        return list(self.old_members) + [m for m in self.members if m.engine_id not in seen]

    @property
    def staying(self) -> list[str]:
        old = {m.engine_id for m in self.old_members}
        return [m.engine_id for m in self.members if m.engine_id in old]

    def role(self, engine_id: str) -> Role:
        if engine_id in self.joiners:
            return Role.joining
        if engine_id in self.leavers:
            return Role.leaving
        return Role.staying

    def prepare_request(self, job_id: str, timeouts: Timeouts | None = None) -> PrepareRequest:
        return PrepareRequest(
            job_id=job_id,
            generation=self.generation,
            old_generation=self.old_generation,
            members=self.members,
            old_members=self.old_members,
            old_placement=self.old_placement,
            placement=self.placement,
            store=self.store,
            warmup_policy=self.warmup_policy,
            strategy=self.strategy,
            transfer_backend=self.transfer_backend,
            leave_policy=self.leave_policy,
            timeouts=timeouts or Timeouts(),
        )

    def summary(self) -> dict[str, object]:
        """What the job records about its plan."""
        return {
            "members": [m.engine_id for m in self.members],
            "old_members": [m.engine_id for m in self.old_members],
            "joiners": self.joiners,
            "leavers": self.leavers,
            "placement": self.placement,
            "store": self.store.model_dump(),
            "warmup_policy": self.warmup_policy.value,
            "warmup_reason": self.warmup_reason,
            "transfer_backend": self.transfer_backend.value,
            "strategy": self.strategy.value,
        }


def resolve_warmup_policy(
    deployment_setting: WarmupSetting, job_setting: WarmupSetting | None, platforms: Sequence[Platform]
) -> tuple[WarmupPolicy, str]:
    """The one policy every participant gets, and why it was chosen."""
    if job_setting is not None and job_setting != "auto":
        return WarmupPolicy(job_setting), "set on the job"
    if deployment_setting != "auto":
        return WarmupPolicy(deployment_setting), "set on the deployment"
    if Platform.rocm in platforms:
        return WarmupPolicy.deferred, "auto: a participant runs on ROCm"
    return WarmupPolicy.eager, "auto: no participant runs on ROCm"


def choose_transfer_backend(offered: Mapping[str, Sequence[TransferBackend]]) -> TransferBackend:
    """NIXL if every participant offers it, else gloo (which every agent can do).

    The same rule as `engine_agent.transfer.choose_backend`, kept here because that module imports
    torch and the coordinator must not."""
    if offered and all(TransferBackend.nixl in backends for backends in offered.values()):
        return TransferBackend.nixl
    return TransferBackend.gloo


def summed_expert_load(infos: Sequence[AgentInfo], num_logical: int) -> list[int]:
    total = [0] * num_logical
    for info in infos:
        for expert, tokens in enumerate(info.expert_load[:num_logical]):
            total[expert] += tokens
    return total


def _load(info: AgentInfo) -> int:
    return sum(info.expert_load)


def _member(info: AgentInfo) -> Member:
    return Member(engine_id=info.engine_id, url=info.url)


def current_members(deployment: DeploymentSpec, infos: Sequence[AgentInfo]) -> list[AgentInfo]:
    """The engines serving the deployment's generation, in rank order."""
    members = [
        i
        for i in infos
        if i.state != AgentState.idle and i.rank is not None and i.generation == deployment.generation
    ]
    members.sort(key=lambda i: i.rank if i.rank is not None else -1)
    ranks = [i.rank for i in members]
    if deployment.generation > 0 and ranks != list(range(len(members))):
        raise PlanError(
            "inconsistent_generation",
            f"generation {deployment.generation} of {deployment.name} should have ranks 0..n-1, "
            f"agents report ranks {ranks}",
        )
    return members


def make_plan(
    deployment: DeploymentSpec,
    infos: Sequence[AgentInfo],
    target_size: int,
    options: JobOptions | None = None,
) -> Plan:
    """Plan a reconfiguration of `deployment` to `target_size` engines.

    `infos` are the `/v1/info` answers of every engine that may take part: the current members and the
    idle engines available to join (joiners are taken from the idle ones in the order given).
    """
    options = options or JobOptions()
    if target_size < 1:
        raise PlanError("invalid_target", f"target size must be >= 1, got {target_size}")
    old = current_members(deployment, infos)
    in_old = {i.engine_id for i in old}
    idle = [i for i in infos if i.engine_id not in in_old and i.state == AgentState.idle]

    if target_size == len(old):
        raise PlanError("no_change", f"{deployment.name} already has {target_size} engines")
    if target_size > len(old):
        need = target_size - len(old)
        if len(idle) < need:
            raise PlanError(
                "not_enough_engines",
                f"scaling {deployment.name} to {target_size} needs {need} idle engines, "
                f"{len(idle)} available",
            )
        joining = idle[:need]
        staying = list(old)
        leaving: list[AgentInfo] = []
    else:
        joining = []
        count = len(old) - target_size
        if options.leaver_choice == "least_loaded":
            # Fewest tokens served leaves first; among equals, the highest rank.
            by_load = sorted(old, key=lambda i: (_load(i), -(i.rank or 0)))
            leaving = by_load[:count]
        else:
            leaving = old[-count:]
        leaving_ids = {i.engine_id for i in leaving}
        staying = [i for i in old if i.engine_id not in leaving_ids]
        leaving.sort(key=lambda i: i.rank or 0)

    new = staying + joining
    for info in new + leaving:
        if info.engine.num_logical_experts != deployment.num_logical_experts:
            raise PlanError(
                "engine_config_mismatch",
                f"engine {info.engine_id} runs {info.engine.num_logical_experts} logical experts, "
                f"deployment {deployment.name} has {deployment.num_logical_experts}",
                info.engine_id,
            )

    load = summed_expert_load(old, deployment.num_logical_experts)
    placement = rebalance(
        load, deployment.num_redundant_experts, len(new), num_logical=deployment.num_logical_experts
    )
    old_placement = [list(slots) for slots in old[0].placement] if old else []

    participants = old + joining
    policy, reason = resolve_warmup_policy(
        deployment.warmup_policy, options.warmup_policy, [i.platform for i in participants]
    )
    backend = options.transfer_backend or choose_transfer_backend(
        {i.engine_id: i.transfer_backends for i in participants}
    )

    return Plan(
        deployment=deployment.name,
        old_generation=deployment.generation,
        generation=deployment.generation + 1,
        old_members=[_member(i) for i in old],
        members=[_member(i) for i in new],
        joiners=[i.engine_id for i in joining],
        leavers=[i.engine_id for i in leaving],
        old_placement=old_placement,
        placement=placement,
        store=new[0].store,
        warmup_policy=policy,
        warmup_reason=reason,
        transfer_backend=backend,
        strategy=options.strategy,
        leave_policy=options.leave_policy,
        expert_load=load,
    )
