"""After the switch: a job succeeds only if every member of the new generation says it serves on it.

An agent answers `committed` once it switched; a peer that died or froze right then leaves the others'
new group broken (they fall back to no generation) or hung. So before the job is recorded `succeeded`,
every member is asked once (`GET /v1/info`, outside the stopped window): serving (or paused) on the new
generation, at the rank the plan gave it. Any other answer, or none, fails the job the way a switch
that failed part-way does (`fail_and_degrade`: the job shows who is on which generation).

The front door is given the new rank set meanwhile (`confirm_while_publishing`): every participant
said it committed, so the switch is done, and asking takes a round trip to every member, which a
client of the front door would otherwise wait through. A member found not serving is taken out by
the failure that follows (its record degraded, the feed re-derived from it, as for any lost engine).
"""

from __future__ import annotations

import asyncio

from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.backends.base import JobFailure
from app.backends.reference.front_door import commit_observed
from app.backends.reference.job import JobRun
from app.backends.reference.record import JobRecord
from app.frontdoor.publish import DoorStep
from engine_agent.protocol import AgentState

CONFIRMED_STATES = frozenset({AgentState.serving, AgentState.paused})


async def confirm_serving(run: JobRun, fleet: Fleet) -> None:
    """Raise `JobFailure` (type `member-not-serving`) naming the first member that does not serve the
    new generation."""
    plan = run.plan
    assert plan is not None
    clients = run.member_clients()
    answers = await fleet.each(clients, lambda c: c.info())
    for client in clients:
        answer = answers[client.engine_id]
        if isinstance(answer, AgentCallError):
            problem = f"did not answer after the switch: {answer.message}"
        elif answer.generation != plan.generation or answer.state not in CONFIRMED_STATES:
            problem = (
                f"is {answer.state.value} on generation {answer.generation}, not serving generation "
                f"{plan.generation}"
            )
        else:
            continue
        raise JobFailure(
            run.state.value, "member-not-serving", f"engine {client.engine_id} {problem}", client.engine_id
        )


async def confirm_while_publishing(
    record: JobRecord, run: JobRun, fleet: Fleet
) -> asyncio.Task[DoorStep] | None:
    """`confirm_serving` while the observed commit is published (`commit_observed`, started first);
    its task, or the `JobFailure` once the publishing ended (its wait for the front door dropped)."""
    observing = asyncio.create_task(commit_observed(record, run))
    try:
        await confirm_serving(run, fleet)
    except BaseException:
        early = await observing
        if early is not None:
            early.cancel()
        raise
    return await observing
