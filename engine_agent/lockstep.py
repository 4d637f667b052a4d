"""One lock-step iteration's collectives over an EP group: the control all-reduce every member makes at
each step boundary (and what its sums decide, the same on every member), and the MoE step that serves
the tokens of every rank through every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_agent import moe
from engine_agent.groups import CommGroup
from engine_agent.protocol import EngineConfig

# The control all-reduce: [pause, hold, armed count, armed generation sum] then tokens per rank.
CONTROL_SLOTS = 4


@dataclass(frozen=True)
class Boundary:
    """What one control all-reduce agreed: every member reads the same sums, so decides the same."""

    pause: bool  # a member asked for a pause and no draining member still holds tokens
    armed: bool  # every member armed for this member's new generation: stop here for the switch
    per_rank: list[int]  # tokens each rank brings to this step


def agree_boundary(
    group: CommGroup,
    device: torch.device,
    *,
    pause_flag: int,
    hold_flag: int,
    armed_for: int,
    my_count: int,
    timeout_s: float | None = None,
) -> Boundary:
    control = torch.zeros(CONTROL_SLOTS + group.size, dtype=torch.int64, device=device)
    control[0] = pause_flag
    control[1] = hold_flag
    control[2] = int(armed_for > 0)
    control[3] = armed_for
    control[CONTROL_SLOTS + group.rank] = my_count
    counts = group.allreduce(control, timeout_s=timeout_s).tolist()
    pause = counts[0] > 0 and counts[1] == 0
    # Every member armed, for the same generation (the sum of equal numbers): switch here.
    armed = (
        armed_for > 0 and counts[1] == 0 and counts[2] == group.size and counts[3] == armed_for * group.size
    )
    return Boundary(pause=pause, armed=armed, per_rank=counts[CONTROL_SLOTS:])


def moe_step(
    config: EngineConfig,
    group: CommGroup,
    layers: list[moe.LayerView],
    hidden_own: torch.Tensor,
    per_rank: list[int],
    device: torch.device,
    timeout_s: float | None = None,
) -> tuple[torch.Tensor, list[list[int]]]:
    """This rank's `hidden_own` rows through every MoE layer: each rank computes its local experts'
    share of every rank's tokens, and each keeps its own rows of the combined result. Returns those
    rows and, per layer, how many of them each logical expert was routed. `timeout_s`: each collective's
    deadline (default the group's)."""
    my_count = hidden_own.shape[0]
    total = sum(per_rank)
    offset = sum(per_rank[: group.rank])
    hidden = config.hidden_size
    loads = []
    for view in layers:
        # Dispatch and combine as all-to-alls: one exchange round each, where ring all-reduces take
        # 2(n-1) rounds (each a wake-up of every peer: what a step cost on loaded cores).
        gathered = torch.empty(total, hidden, dtype=torch.float32, device=device)
        group.alltoall(
            gathered,
            hidden_own.repeat(group.size, 1),
            per_rank,
            [my_count] * group.size,
            timeout_s=timeout_s,
        )
        partial, experts = moe.local_contribution(
            config, view.router, gathered, group.rank, view.placement, view.table, view.weights, view.grouped
        )
        back = torch.empty(group.size * my_count, hidden, dtype=torch.float32, device=device)
        group.alltoall(back, partial, [my_count] * group.size, per_rank, timeout_s=timeout_s)
        hidden_own = back.view(group.size, my_count, hidden).sum(dim=0)
        loads.append(
            torch.bincount(
                experts[offset : offset + my_count].reshape(-1).cpu(),
                minlength=config.num_logical_experts,
            ).tolist()
        )
    return hidden_own, loads
