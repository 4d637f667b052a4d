"""Checking a prepare request against this engine before anything starts: its role, the placements,
the generations. A refusal changes nothing."""

from __future__ import annotations

from engine_agent.placement import validate_placement
from engine_agent.protocol import EngineConfig, PrepareRequest, Role, layer_placements
from engine_agent.reconfig.errors import Conflict, InvalidRequest
from engine_agent.serving import ActiveGeneration


def validate(me: str, request: PrepareRequest, config: EngineConfig, active: ActiveGeneration | None) -> Role:
    """The role this engine plays in `request`, once the request is found sound: `InvalidRequest`
    (422) for a request that is wrong anywhere, `Conflict` (409) for one that does not fit what this
    engine serves now (`active`)."""
    role = request.role_of(me)
    if role is None:
        raise Conflict("not-a-participant", f"{me} is neither in members nor in old_members")
    new_ids = [m.engine_id for m in request.members]
    old_ids = [m.engine_id for m in request.old_members]
    try:
        _validate_layers(request, config, len(new_ids), len(old_ids))
    except ValueError as exc:
        raise InvalidRequest(f"invalid placement: {exc}") from exc
    if role == Role.joining and active is not None:
        raise Conflict(
            "generation-mismatch", f"{me} serves generation {active.generation}; it cannot join as new"
        )
    if role != Role.joining:
        if active is None or active.generation != request.old_generation:
            held = active.generation if active else "none"
            raise Conflict(
                "generation-mismatch",
                f"{me} serves generation {held}, the job's old generation is {request.old_generation}",
            )
        if old_ids.index(me) != active.rank:
            raise Conflict("generation-mismatch", f"{me} is rank {active.rank}, not {old_ids.index(me)}")
    if request.generation <= request.old_generation:
        raise InvalidRequest("generation must be greater than old_generation")
    return role


def _validate_layers(request: PrepareRequest, config: EngineConfig, new_size: int, old_size: int) -> None:
    """One placement per MoE layer (or one in all, for a one-layer engine), each valid for its size."""
    layers = config.num_moe_layers
    new = layer_placements(request.placement, request.placements)
    old = layer_placements(request.old_placement, request.old_placements)
    if request.placements and request.placements[0] != request.placement:
        raise ValueError("placement must be layer 0 of placements")
    if len(new) != layers:
        raise ValueError(f"{len(new)} layer placement(s) for an engine of {layers} MoE layers")
    if old_size and len(old) != layers:
        raise ValueError(f"{len(old)} old layer placement(s) for an engine of {layers} MoE layers")
    for layer, placement in enumerate(new):
        validate_placement(placement, config.num_logical_experts)
        if len(placement) != new_size:
            raise ValueError(f"layer {layer}: placement has {len(placement)} ranks for {new_size} members")
    for layer, placement in enumerate(old if old_size else []):
        if len(placement) != old_size:
            raise ValueError(
                f"layer {layer}: old_placement has {len(placement)} ranks for {old_size} members"
            )
        validate_placement(placement, config.num_logical_experts)
    if not old_size and request.old_placement:
        raise ValueError(f"old_placement has {len(request.old_placement)} ranks for 0 members")
