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
from engine_agent.step_graphs import StepGraphs, layer_step

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
    values = [pause_flag, hold_flag, int(armed_for > 0), armed_for] + [0] * group.size
    values[CONTROL_SLOTS + group.rank] = my_count
    if group.size == 1:
        # A one-member all-reduce is the identity: its sums are this member's values, and on a GPU it
        # cost three waits for the device (copy in, the collective, copy out) in every step. A group
        # given up still ends the loop here, as the collective would have.
        group.check_abandoned(f"control all-reduce on {group.name} (generation {group.generation})")
        counts = values
    else:
        # Built on the host and copied once: five element writes on a GPU were five kernel launches.
        control = torch.tensor(values, dtype=torch.int64).to(device)
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
    graphs: StepGraphs | None = None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """This rank's `hidden_own` rows through every MoE layer: each rank computes its local experts'
    share of every rank's tokens, and each keeps its own rows of the combined result. Returns those
    rows, per layer how many of them each logical expert was routed ([layers, L] on the device), and
    whether the step ran from graphs. Nothing here waits for the device: on a GPU the whole step is
    queued on the stream, and the caller's `group.wait_device` holds it to the deadline (`timeout_s`,
    default the group's). With `graphs`, a step that fits a bucket replays its captured graphs."""
    my_count = hidden_own.shape[0]
    total = sum(per_rank)
    offset = sum(per_rank[: group.rank])
    hidden = config.hidden_size
    bucket = graphs.bucket(total) if graphs is not None else None
    if bucket is not None:
        bucket.set_counts(total, offset, offset + my_count)
    loads = []
    alone = group.size == 1  # a one-member all-to-all is the identity: no call (the control all-reduce stays)
    mine = [my_count] * group.size  # this rank's rows, to or from each member
    for layer, view in enumerate(layers):
        # Dispatch and combine as all-to-alls: one exchange round each, where ring all-reduces take
        # 2(n-1) rounds (each a wake-up of every peer: what a step cost on loaded cores). With graphs,
        # the dispatch lands in the bucket's input itself.
        if bucket is not None:
            gathered = bucket.inputs[:total]
            if alone:
                gathered.copy_(hidden_own)
        elif alone:
            gathered = hidden_own
        else:
            gathered = torch.empty(total, hidden, dtype=torch.float32, device=device)
        if not alone:
            sent = hidden_own.repeat(group.size, 1)
            group.alltoall(gathered, sent, per_rank, mine, timeout_s=timeout_s, in_step=True)
        if bucket is not None:
            partial, load = bucket.run(layer)
            partial = partial[:total]
        else:
            own = (offset, offset + my_count)
            partial, load = layer_step(config, view, group.rank, gathered, None, own, None)
        if alone:
            hidden_own = partial
        else:
            back = torch.empty(group.size * my_count, hidden, dtype=torch.float32, device=device)
            group.alltoall(back, partial, mine, per_rank, timeout_s=timeout_s, in_step=True)
            hidden_own = back.view(group.size, my_count, hidden).sum(dim=0)
        loads.append(load)
    # One layer: its counts as a view (no kernel); more: one stack.
    stacked = loads[0].unsqueeze(0) if len(loads) == 1 else torch.stack(loads)
    return hidden_own, stacked, bucket is not None
