"""Acting on a fenced freeze (issue 39): the members that wait on the frozen one are told to give its
group up now (`POST /v1/generation/broken`, as a peer's notice), so each leaves its stuck collective
within one wait slice rather than at the serving deadline. Best effort: a member that does not hear it
leaves at the deadline, as before; the abandoned group is buried by the agent until its own collective
times out (`engine_agent.groups`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlmodel import Session

from app.agents.errors import AgentCallError
from app.agents.fleet import Fleet
from app.backends.reference.liveness.verdict import Leave
from app.deployments.agent_keys import agent_keys_of
from app.deployments.models import Deployment
from app.jobs.async_record import WorkerSessions
from engine_agent.protocol import GenerationBroken

log = logging.getLogger(__name__)

REPORTER = "coordinator"
LEAVE_CALL_TIMEOUT_S = 2.0  # one member's answer (a loaded host's: hundreds of ms)


async def tell_to_leave(
    record: WorkerSessions, new_fleet: Callable[[], Fleet], deployment_id: str, leave: Leave
) -> None:
    def keys_of(session: Session) -> list[str]:
        deployment = session.get(Deployment, deployment_id)
        return list(agent_keys_of(deployment)) if deployment is not None else []

    keys = await record.run_in_session(keys_of)
    notice = GenerationBroken(generation=leave.generation, reason=leave.reason[:2000], reporter=REPORTER)
    async with new_fleet() as fleet:
        clients = [fleet.client(engine_id, url, keys) for engine_id, url in leave.engines]
        answers = await fleet.each(
            clients, lambda c: c.generation_broken(notice, timeout_s=LEAVE_CALL_TIMEOUT_S)
        )
    failed = {k: v for k, v in answers.items() if isinstance(v, AgentCallError)}
    if failed:
        log.warning("telling %s to leave generation %s failed: %s", sorted(failed), leave.generation, failed)
    log.warning("told %s to leave generation %s: %s", sorted(answers), leave.generation, leave.reason)
