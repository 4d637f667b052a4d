"""After the switch: a job succeeds only if every member of the new generation says it serves on it.

An agent answers `committed` once it switched; a peer that died or froze right then leaves the others'
new group broken (they fall back to no generation) or hung. So before the job is recorded `succeeded`,
every member is asked once (`GET /v1/info`, outside the stopped window): serving (or paused) on the new
generation, at the rank the plan gave it. Any other answer, or none, fails the job the way a switch
that failed part-way does (`fail_and_degrade`: the job shows who is on which generation).
"""

from __future__ import annotations

from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.backends.base import JobFailure
from app.backends.reference.job import JobRun
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
