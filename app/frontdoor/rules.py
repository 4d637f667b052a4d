"""Each engine's state at the front door, as pure rules over the record (no database, no clock).

    left, on the serving generation        -> out (lost: written off, or deregistered, without a job;
                                              listed until a generation forms without it)
    left, otherwise                        -> not listed (retired: a leaver after its switch, a
                                              released joiner or spare, a stopped deployment's)
    fenced | unreachable                   -> out (reason: the engine's state)
    not a member of the serving generation -> out (joining: a joiner before the switch that makes it a
                                              member; not-a-member: any other idle engine)
    member, leaver of the active job       -> draining (from the moment the job's plan names it, so it
                                              is drained before it stops admitting at prepare)
    member, paused, no job inside its work -> out (paused: a pause lease outliving its job)
    member                                 -> ready (a member paused inside a job's commit holds the
                                              requests it receives, so it stays in)

A job that ends without a switch (rolled back, cancelled) gives its leavers back: once its engines
resumed, its results say they ended on the old generation, and they are `ready` again before the job
ends, as the front door was before it.

A job whose results say every member ended on the new generation (written the moment the coordinator
saw every participant committed and serving it, before the slower move that applies the generation)
is read as that move will record it (`as_switched`, the same changes as `apply_generation`): the new
rank set is published from the observed commit, and the move then derives the same set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum


class EndpointState(StrEnum):
    ready = "ready"  # receives new requests
    draining = "draining"  # finishes what it holds, receives no new request
    out = "out"  # receives nothing


class OutReason(StrEnum):
    fenced = "fenced"
    unreachable = "unreachable"
    joining = "joining"
    not_a_member = "not-a-member"
    paused = "paused"
    lost = "lost"  # left the serving generation without a job (the self-heal writes a lost member off)


# Job states in which the engines may be paused by the job itself (blocking prepare, the commit).
WORKING_JOB_STATES = frozenset({"preparing", "syncing", "committing", "cleaning_up"})
TERMINAL_JOB_STATES = frozenset({"succeeded", "rolled_back", "failed", "cancelled"})
MEMBER_ENGINE_STATES = frozenset({"serving", "paused"})


@dataclass(frozen=True)
class EngineFacts:
    id: str
    url: str
    state: str
    dp_rank: int | None
    generation: int


@dataclass(frozen=True)
class JobFacts:
    id: str
    state: str
    roles: Mapping[str, str] = field(default_factory=dict)  # engine id -> joining | staying | leaving
    switched_to: int | None = None  # its results say every member serves this generation
    new_ranks: Mapping[str, int] = field(default_factory=dict)  # member -> its rank there

    @property
    def active(self) -> bool:
        return self.state not in TERMINAL_JOB_STATES


@dataclass(frozen=True)
class Endpoint:
    engine_id: str
    address: str  # where the front door sends its requests (the agent's `/v1/infer` is under it)
    dp_rank: int | None
    generation: int
    state: EndpointState
    reason: str | None = None  # why it is not `ready`

    def key(self) -> tuple[object, ...]:
        return (self.engine_id, self.address, self.dp_rank, self.generation, self.state.value, self.reason)


def endpoint_of(
    engine: EngineFacts, generation: int, job: JobFacts | None, formed: bool = True
) -> Endpoint | None:
    """One engine's endpoint (None: not listed). `formed`: the deployment has a serving generation
    (size above 0; a stopped one has none, and its engines are retired)."""

    def made(state: EndpointState, reason: str | None = None) -> Endpoint:
        return Endpoint(engine.id, engine.url, engine.dp_rank, engine.generation, state, reason)

    if engine.state == "left":
        # A member written off (the self-heal's `left` for a lost one) stays on its generation's record
        # until a job forms one without it: a router is told it is out and why, not left to guess from
        # its absence. Any other engine that left was on no serving generation (a leaver keeps its old
        # one), so it is gone.
        lost = formed and engine.generation == generation
        return made(EndpointState.out, OutReason.lost.value) if lost else None
    if engine.state in (OutReason.fenced.value, OutReason.unreachable.value):
        return made(EndpointState.out, engine.state)
    active = job if job is not None and job.active else None
    member = (
        engine.dp_rank is not None
        and engine.generation == generation
        and engine.state in MEMBER_ENGINE_STATES
    )
    if not member:
        joining = active is not None and active.roles.get(engine.id) == "joining"
        return made(EndpointState.out, OutReason.joining.value if joining else OutReason.not_a_member.value)
    if active is not None and active.roles.get(engine.id) == "leaving":
        return made(EndpointState.draining, f"leaving in job {active.id}")
    if engine.state == "paused" and (active is None or active.state not in WORKING_JOB_STATES):
        return made(EndpointState.out, OutReason.paused.value)
    return made(EndpointState.ready)


def as_switched(
    generation: int, engines: Iterable[EngineFacts], job: JobFacts | None
) -> tuple[int, list[EngineFacts]]:
    """The generation and engines as the record will say once an active job whose members all switched
    is recorded (`apply_generation`: members serving at their new rank, leavers idle without one); as
    they are otherwise (no such job, or the move already applied it)."""
    listed = list(engines)
    if job is None or not job.active or job.switched_to is None or job.switched_to == generation:
        return generation, listed
    switched = []
    for engine in listed:
        rank = job.new_ranks.get(engine.id)
        if rank is not None:
            engine = replace(engine, state="serving", dp_rank=rank, generation=job.switched_to)
        elif job.roles.get(engine.id) == "leaving":
            engine = replace(engine, state="idle", dp_rank=None)
        switched.append(engine)
    return job.switched_to, switched


def rank_set(
    generation: int, engines: Iterable[EngineFacts], job: JobFacts | None, formed: bool = True
) -> list[Endpoint]:
    """The deployment's endpoints, ready ones first by rank, then the others by engine id (`formed`:
    as `endpoint_of`)."""
    generation, engines = as_switched(generation, engines, job)
    endpoints = (endpoint_of(engine, generation, job, formed) for engine in engines)
    listed = [e for e in endpoints if e is not None]
    return sorted(
        listed,
        key=lambda e: (
            e.state != EndpointState.ready,
            e.dp_rank if e.dp_rank is not None else 1 << 30,
            e.engine_id,
        ),
    )


def roles_of(engine_results: Sequence[Mapping[str, object]] | None) -> dict[str, str]:
    """A job's roles by engine, from its per-engine results (written with its plan, before prepare). A
    leaver whose result says it ended on the generation it had (the job is ending on the old one: its
    engines resumed) stays: the front door is given back as it was before the job ends."""
    roles: dict[str, str] = {}
    for result in engine_results or ():
        engine_id, role = result.get("engine_id"), result.get("role")
        if isinstance(engine_id, str) and isinstance(role, str):
            after = result.get("generation_after")
            stays = role == "leaving" and after is not None and after == result.get("generation_before")
            roles[engine_id] = "staying" if stays else role
    return roles


def switch_of(engine_results: Sequence[Mapping[str, object]] | None) -> tuple[int | None, dict[str, int]]:
    """The generation every member of a job's results ended on, with their ranks there (None: the
    results do not say every member switched: a job still running, rolled back or split)."""
    ranks: dict[str, int] = {}
    generations: set[object] = set()
    for result in engine_results or ():
        engine_id, rank = result.get("engine_id"), result.get("new_rank")
        if isinstance(engine_id, str) and isinstance(rank, int):
            ranks[engine_id] = rank
            generations.add(result.get("generation_after"))
    if len(generations) != 1:
        return None, {}
    (generation,) = generations
    if not isinstance(generation, int) or isinstance(generation, bool):
        return None, {}
    return generation, ranks
