"""The protocol's choreography: which call moves an agent from which phase to which, in what order.

Torch-free and free of the protocol's models, so `engine_agent.protocol` re-exports all of it and every
side reads the same table: the agent's executor and routes, the coordinator's flow and crash recovery,
the runner's fake agents and the benchmark's lightweight agents.

The calls of one reconfiguration, in order (`CALLS`; sync may be left out):

    strategy    commit       calls
    background  coordinator  prepare -> sync -> pause -> switch   (the old generation serves until the pause)
    background  engines      prepare -> sync -> arm               (armed -> paused -> switching -> committed)
    blocking    either       prepare -> pause -> sync -> switch   (prepare's work runs inside the pause)

Each call's phases (`MOVES`): the phase while it runs, and the one it ends in, which is also what an
action POST with `wait_s` waits for by default:

    call     running    ends in
    prepare  preparing  prepared
    sync     syncing    synced
    pause    pausing    paused
    switch   switching  committed
    arm      armed      committed    (through paused and switching, at the boundary all armed for)
    resume   resuming   resumed
    abort    aborting   aborted

Which phases each forward call may start from (`ACCEPTS`) follows from the order: the end phase of the
call before it, and of the one before that where the call before it is the optional sync:

    background  sync <- prepared    pause <- prepared, synced    switch <- paused
                arm <- prepared, synced
    blocking    pause <- prepared   sync <- paused               switch <- paused, synced    (no arm)

`resume` and `abort` take a job back to the old generation from any phase before the switch
(`COMMITTING`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Strategy(StrEnum):
    background = "background"  # prepare while serving; commit only switches
    blocking = "blocking"  # the old way: all of prepare inside the paused window


class CommitMode(StrEnum):
    """Who decides the moment of the switch (per job)."""

    engines = "engines"  # the coordinator arms; the engines agree on the boundary among themselves
    coordinator = "coordinator"  # the two-step commit: pause everywhere, then switch everywhere


class ReconfigPhase(StrEnum):
    preparing = "preparing"
    prepared = "prepared"
    syncing = "syncing"
    synced = "synced"
    armed = "armed"  # engine-agreed commit: waiting for the boundary every member is armed for
    pausing = "pausing"
    paused = "paused"
    switching = "switching"
    committed = "committed"  # switched and serving the new generation (or idle, for a leaver)
    resuming = "resuming"
    resumed = "resumed"  # rolled back after a pause: serving the old generation again
    aborting = "aborting"
    aborted = "aborted"
    failed = "failed"


class Operation(StrEnum):
    """The calls the coordinator makes, each named in the status while it runs."""

    prepare = "prepare"
    sync = "sync"
    pause = "pause"
    switch = "switch"
    arm = "arm"  # the engine-agreed commit: pause and switch at the boundary every member armed for
    resume = "resume"
    abort = "abort"

    @property
    def path(self) -> str:
        """Where the agent serves it (`POST`)."""
        return f"/v1/reconfig/{self.value}"


@dataclass(frozen=True)
class Move:
    """One call: the phase while it runs, and the phase it ends in."""

    running: ReconfigPhase
    done: ReconfigPhase


P = ReconfigPhase

MOVES: Mapping[Operation, Move] = {
    Operation.prepare: Move(P.preparing, P.prepared),
    Operation.sync: Move(P.syncing, P.synced),
    Operation.pause: Move(P.pausing, P.paused),
    Operation.switch: Move(P.switching, P.committed),
    Operation.arm: Move(P.armed, P.committed),
    Operation.resume: Move(P.resuming, P.resumed),
    Operation.abort: Move(P.aborting, P.aborted),
}

_COORDINATOR_COMMIT = (Operation.prepare, Operation.sync, Operation.pause, Operation.switch)
_BLOCKING = (Operation.prepare, Operation.pause, Operation.sync, Operation.switch)

CALLS: Mapping[tuple[Strategy, CommitMode], tuple[Operation, ...]] = {
    (Strategy.background, CommitMode.coordinator): _COORDINATOR_COMMIT,
    (Strategy.background, CommitMode.engines): (Operation.prepare, Operation.sync, Operation.arm),
    (Strategy.blocking, CommitMode.coordinator): _BLOCKING,
    # Prepare's work runs inside the pause: nothing is left for the engines to agree on, the
    # coordinator commits.
    (Strategy.blocking, CommitMode.engines): _BLOCKING,
}

FORWARD = (Operation.sync, Operation.pause, Operation.switch, Operation.arm)  # each follows another call


def _accepts(strategy: Strategy) -> dict[Operation, frozenset[ReconfigPhase]]:
    """The phases each forward call may start from under `strategy` (see the module docstring)."""
    accepts: dict[Operation, set[ReconfigPhase]] = {operation: set() for operation in FORWARD}
    for (of_strategy, _), calls in CALLS.items():
        if of_strategy != strategy:
            continue
        for index in range(1, len(calls)):
            before = calls[index - 1]
            accepts[calls[index]].add(MOVES[before].done)
            if before is Operation.sync:  # sync may be left out
                accepts[calls[index]].add(MOVES[calls[index - 2]].done)
    return {operation: frozenset(phases) for operation, phases in accepts.items()}


ACCEPTS: Mapping[Strategy, Mapping[Operation, frozenset[ReconfigPhase]]] = {
    strategy: _accepts(strategy) for strategy in Strategy
}


def calls_for(strategy: Strategy, commit_mode: CommitMode) -> tuple[Operation, ...]:
    return CALLS[(strategy, commit_mode)]


TERMINAL_PHASES = frozenset({P.committed, P.resumed, P.aborted, P.failed})

# On the way back to the old generation: the status still carries the error that caused the way back
# (it is reported again at the end), so an error seen here does not end a wait.
RECOVERING_PHASES = frozenset({P.aborting, P.resuming})

# Back on the old generation: what a rollback waits for (an abort resumes a paused engine).
ROLLED_BACK = frozenset({MOVES[Operation.resume].done, MOVES[Operation.abort].done})

# Once switching, there is no old generation to go back to: resume and abort are refused.
COMMITTING = frozenset({P.switching, P.committed})

# An arm that runs or ran: the phases it moves through (a retried arm changes nothing).
ARMED_ONWARD = frozenset({P.armed, P.paused, P.switching, P.committed})

# An engine stopped (or stopping) for the job, still on the old generation's side of the switch.
STOPPED = frozenset({P.pausing, P.paused, P.switching})

# An engine-agreed commit the engines finish without the coordinator (switch, or go back).
ENGINES_FINISHING = frozenset({P.armed, P.paused, P.switching})

# Phases that end an operation's work: the status counts every step of it as done.
STEPS_COMPLETE = frozenset({P.prepared, P.synced, P.paused, P.committed})
