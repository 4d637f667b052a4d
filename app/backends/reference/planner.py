"""The plan of one reconfiguration: who is in the new generation, where experts go, and how.

Pure: no database, no HTTP. The runner reads the deployment and asks the agents for `/v1/info`, then
calls `make_plan`; everything it sends in `prepare` comes from the returned `Plan`.

Rules:
- members keep the existing ranks' order; joiners are appended; leavers are the highest ranks, or the
  engines the job names (`retire`), the others renumbered compactly (`Plan.rank_map`).
- the placement of every MoE layer is `engine_agent.layer_placement.rebalance_layers` over that layer's
  expert load summed across the old members (uniform when nothing was served yet), planned from the
  old placement so that few expert copies move (`Plan.placement_stats`: copies, bytes, the lower
  bound, balance), and covering what it can: every expert on two engines, on two failure domains
  where the engines span several (`Plan.coverage`). The failure domain of an engine is its data host
  (`data_host` at registration; the host of its rendezvous store in `/v1/info`): engines that share a
  data address share a machine, and a machine's loss takes them all.
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

from app.backends.reference.resident import kept_placement, resident_rows, spare_filled
from app.core.faults import EngineFault
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
    layer_placements,
)

WarmupSetting = Literal["auto", "eager", "deferred"]
Placements = list[list[list[int]]]  # [layer][rank][slot] = logical expert


class PlanError(EngineFault):
    """The reconfiguration cannot be planned from what the agents report."""

    def __init__(self, type_: str, message: str, engine_id: str | None = None) -> None:
        super().__init__(message, engine_id, type_=type_)


@dataclass(frozen=True)
class DeploymentSpec:
    """The parts of a deployment the planner needs (the runner builds it from the database row)."""

    name: str
    num_logical_experts: int
    num_redundant_experts: int
    generation: int  # the generation now serving (0: nothing serves yet)
    warmup_policy: WarmupSetting = "auto"
    expert_nbytes: int = 0  # one expert's weights in one layer (bytes moved = copies x this)
    num_moe_layers: int = 1


@dataclass(frozen=True)
class JobOptions:
    warmup_policy: WarmupSetting | None = None  # None: the deployment's setting
    strategy: Strategy = Strategy.background
    leave_policy: LeavePolicy = LeavePolicy.finish
    transfer_backend: TransferBackend | None = None  # None: NIXL when every participant offers it
    retire: tuple[str, ...] = ()  # the engines that leave a scale-down (default: the highest ranks)


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
    layer_expert_load: list[list[int]] = field(default_factory=list)
    old_placements: list[list[list[int]]] = field(default_factory=list)  # per layer; empty: one layer
    placements: list[list[list[int]]] = field(default_factory=list)
    placement_stats: dict[str, object] = field(default_factory=dict)
    coverage: dict[str, object] = field(default_factory=dict)  # of the new placement (`Coverage.record`)

    @property
    def rank_map(self) -> dict[str, dict[str, int | None]]:
        """engine id -> {"old": rank or None (joiner), "new": rank or None (leaver)}, old members first."""
        old = {m.engine_id: rank for rank, m in enumerate(self.old_members)}
        new = {m.engine_id: rank for rank, m in enumerate(self.members)}
        return {engine: {"old": old.get(engine), "new": new.get(engine)} for engine in {**old, **new}}

    def placement_record(self) -> dict[str, object]:
        """What the job keeps about the placement: the rank map and what moves."""
        return {"rank_map": self.rank_map, **self.placement_stats}

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
            old_placements=self.old_placements,
            placements=self.placements,
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
            "rank_map": self.rank_map,
            "placement_stats": self.placement_stats,
            "coverage": self.coverage,
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


def summed_expert_load(infos: Sequence[AgentInfo], num_logical: int, num_layers: int = 1) -> list[list[int]]:
    """Per layer, tokens routed to each logical expert over `infos`. An agent that reports no per-layer
    load counts its total for every layer."""
    total = [[0] * num_logical for _ in range(num_layers)]
    for info in infos:
        per_layer = info.layer_expert_load if len(info.layer_expert_load) == num_layers else None
        for layer in range(num_layers):
            counts = per_layer[layer] if per_layer is not None else info.expert_load
            for expert, tokens in enumerate(counts[:num_logical]):
                total[layer][expert] += tokens
    return total


def failure_domain(info: AgentInfo) -> str:
    """The failure domain an engine belongs to: its data host."""
    return info.store.host


def plan_placement(
    deployment: DeploymentSpec, old: Sequence[AgentInfo], new: Sequence[AgentInfo]
) -> tuple[Placements, Placements, list[list[int]], dict[str, object], dict[str, object]]:
    """(old placements, new placements, load, stats, coverage), per MoE layer: every layer planned from
    the placement the old generation serves (when it reports one for every layer and member), so that
    few expert copies move, covering what the slots and the balance allow."""
    # numpy is imported here, not with the coordinator: its start is on the path of every restart.
    from engine_agent.layer_placement import rebalance_layers

    layers = deployment.num_moe_layers
    domains = [failure_domain(info) for info in new]
    load = summed_expert_load(old, deployment.num_logical_experts, layers)
    old_placements = layer_placements(old[0].placement, old[0].placements) if old else []
    old_rank = {info.engine_id: rank for rank, info in enumerate(old)}
    usable = (
        len(old_placements) == layers
        and all(len(p) == len(old) > 0 for p in old_placements)
        and len({len(slots) for p in old_placements for slots in p}) == 1
    )
    previous: Placements | None = old_placements if usable else None
    origin = [old_rank.get(info.engine_id) for info in new] if usable else None
    # Nobody serves (the group broke): the rows the new members kept from it are the old rows.
    resident = resident_rows(deployment.generation, new, layers) if not old else None
    if resident is not None:
        previous, origin = resident
        kept = kept_placement(previous, origin, deployment.num_logical_experts)
        if kept is None and (filled := spare_filled(deployment.generation, new, layers)) is not None:
            filled_stats, filled_coverage = _kept_record(filled, load, domains, new)
            return [], filled, load, {**filled_stats, "source": "spare"}, filled_coverage
        if kept is not None:
            return [], kept, load, *_kept_record(kept, load, domains, new)
    layer_plan = rebalance_layers(
        load,
        deployment.num_redundant_experts,
        len(new),
        previous=previous,
        origin=origin,
        num_logical=deployment.num_logical_experts,
        domains=domains,
    )
    stats: dict[str, object] = {
        "layers": layers,
        "copies_moved": layer_plan.copies_moved,
        "bytes_moved": layer_plan.copies_moved * deployment.expert_nbytes,
        "lower_bound": layer_plan.lower_bound,
        "balance": round(float(layer_plan.balance.min()), 4),
        "fresh_balance": round(float(layer_plan.fresh_balance.min()), 4),
    }
    if resident is not None:
        stats["source"] = "resident"  # planned from the survivors' rows; what they lack loads
    coverage: dict[str, object] = {}
    if layer_plan.coverage is not None:
        coverage = layer_plan.coverage.record([info.engine_id for info in new], domains)
    old_lists = [[list(s) for s in p] for p in old_placements]
    return old_lists, layer_plan.to_lists(), load, stats, coverage


def _kept_record(
    kept: Placements, load: list[list[int]], domains: list[str], new: Sequence[AgentInfo]
) -> tuple[dict[str, object], dict[str, object]]:
    """(stats, coverage) of a placement kept as the survivors hold it: nothing moves."""
    import numpy as np

    from engine_agent.layer_coverage import coverage_of
    from engine_agent.layer_placement import layer_balance, normalized_loads

    array = np.asarray(kept, dtype=np.int64)
    loads = normalized_loads(load, len(load[0]) if load else None)
    stats: dict[str, object] = {
        "layers": len(kept),
        "copies_moved": 0,
        "bytes_moved": 0,
        "lower_bound": 0,
        "balance": round(float(layer_balance(array, loads).min()), 4),
        "source": "resident",  # the survivors' rows as they are: a covered loss
    }
    coverage = coverage_of(array, loads.shape[1], domains).record([i.engine_id for i in new], domains)
    return stats, coverage


def _joining_order(info: AgentInfo, generation: int) -> int:
    """Joiners first: the survivors of the generation that broke (they hold its rows), then warm spares
    (they hold every expert), then the rest."""
    if info.resident is not None and info.resident.generation == generation:
        return 0
    return 1 if info.spare_bytes > 0 else 2


def _member(info: AgentInfo) -> Member:
    return Member(engine_id=info.engine_id, url=info.url, data=info.store)


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
            "inconsistent-generation",
            f"generation {deployment.generation} of {deployment.name} should have ranks 0..n-1, "
            f"agents report ranks {ranks}",
        )
    return members


def choose_leavers(
    name: str, old: Sequence[AgentInfo], count: int, retire: Sequence[str]
) -> tuple[list[AgentInfo], list[AgentInfo]]:
    """(leaving, staying in rank order): the engines named in `retire`, else the `count` highest ranks.
    The request was validated when the job was created; membership may have changed since."""
    if not retire:
        return list(old[len(old) - count :]), list(old[: len(old) - count])
    members = {info.engine_id for info in old}
    strangers = [engine for engine in retire if engine not in members]
    if strangers:
        raise PlanError(
            "retire-not-member",
            f"retire names engines that no longer serve {name}: {strangers}",
            strangers[0],
        )
    if len(set(retire)) != count:
        raise PlanError(
            "retire-count-mismatch",
            f"shrinking {name} by {count} retires {count}, retire names {len(retire)}",
        )
    leaving = [info for info in old if info.engine_id in retire]
    return leaving, [info for info in old if info.engine_id not in retire]


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
        raise PlanError("invalid-target", f"target size must be >= 1, got {target_size}")
    old = current_members(deployment, infos)
    in_old = {i.engine_id for i in old}
    idle = [i for i in infos if i.engine_id not in in_old and i.state == AgentState.idle]
    idle.sort(key=lambda i: _joining_order(i, deployment.generation))  # stable: else the order given

    if target_size == len(old):
        raise PlanError("no-change", f"{deployment.name} already has {target_size} engines")
    if target_size > len(old):
        need = target_size - len(old)
        if len(idle) < need:
            raise PlanError(
                "not-enough-engines",
                f"scaling {deployment.name} to {target_size} needs {need} idle engines, "
                f"{len(idle)} available",
            )
        joining = idle[:need]
        staying = list(old)
        leaving: list[AgentInfo] = []
    else:
        joining = []
        leaving, staying = choose_leavers(deployment.name, old, len(old) - target_size, options.retire)

    new = staying + joining
    for info in new + leaving:
        if info.engine.num_logical_experts != deployment.num_logical_experts:
            raise PlanError(
                "engine-config-mismatch",
                f"engine {info.engine_id} runs {info.engine.num_logical_experts} logical experts, "
                f"deployment {deployment.name} has {deployment.num_logical_experts}",
                info.engine_id,
            )
        if info.engine.num_moe_layers != deployment.num_moe_layers:
            raise PlanError(
                "engine-config-mismatch",
                f"engine {info.engine_id} runs {info.engine.num_moe_layers} MoE layers, "
                f"deployment {deployment.name} has {deployment.num_moe_layers}",
                info.engine_id,
            )

    old_placements, placements, layer_load, stats, coverage = plan_placement(deployment, old, new)

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
        old_placement=old_placements[0] if old_placements else [],
        placement=placements[0],
        old_placements=old_placements if deployment.num_moe_layers > 1 else [],
        placements=placements if deployment.num_moe_layers > 1 else [],
        store=new[0].store,
        warmup_policy=policy,
        warmup_reason=reason,
        transfer_backend=backend,
        strategy=options.strategy,
        leave_policy=options.leave_policy,
        expert_load=[sum(column) for column in zip(*layer_load, strict=True)],
        layer_expert_load=layer_load,
        placement_stats=stats,
        coverage=coverage,
    )
