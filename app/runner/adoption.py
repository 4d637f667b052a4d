"""Adoption: a coordinator that starts checks, once, that the engines the record names still serve.

Engines outlive their coordinator (serving never depends on it), so a coordinator that starts (after a
crash, a slow restart, or beside a dead one of an HA pair) finds deployments whose record says `ready`
at some size. It asks every recorded member of each deployment no job runs for `/v1/info`, at once:

- it answers serving (or paused) on the recorded generation: adopted, its record refreshed;
- it answers something else (idle: its group broke meanwhile; another generation): its record takes
  what it says, as a heartbeat would, and the health pass judges the deployment;
- nothing listens (connection refused): gone, marked `unreachable` now, and self-healing acts;
- no answer within the agent call deadline: fenced (`app.runner.stalls`): out of the generation, not
  stopped, re-admitted if it comes back within the heartbeat timeout; but the one member that does not
  answer while every other serves the generation with it is stepping with them: only the coordinator's
  link to it is lost (`link_lost_at`, a condition; the heartbeat expiry judges it again).

So a deployment is never `ready` with a member that does not answer, and the health pass that runs in
the same transaction says which engines are missing. The outcome per deployment is logged, and kept on
the runner (`JobRunner.adoption`) for `epctl up`, which reports "adopted" only when it is true.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlmodel import Session

from app.agents.errors import AgentCallError, AgentUnreachable
from app.agents.fleet import Fleet
from app.core.clock import utc_now
from app.deployments.agent_keys import agent_keys_of
from app.deployments.engines.models import Engine, EngineState
from app.deployments.engines.service import mark_unreachable
from app.deployments.health import SERVING_STATES, deployments_without_a_job, reconcile_health
from app.deployments.models import Deployment
from app.jobs.async_record import WorkerSessions
from app.runner.selfheal import fence
from engine_agent.protocol import AgentInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Adoption:
    """What one deployment's recorded members answered a starting coordinator."""

    deployment: str
    generation: int
    size: int
    serving: list[str] = field(default_factory=list)  # answered serving the recorded generation
    changed: list[str] = field(default_factory=list)  # answered, in another state or generation
    gone: list[str] = field(default_factory=list)  # nothing listens
    silent: list[str] = field(default_factory=list)  # no answer in time: fenced

    @property
    def adopted(self) -> bool:
        return len(self.serving) == self.size and not (self.changed or self.gone or self.silent)

    def summary(self) -> str:
        if self.adopted:
            return f"{self.size} engines, generation {self.generation}"
        parts = [f"{len(self.serving)} of {self.size} engines serve generation {self.generation}"]
        for label, ids in (
            ("gone", self.gone),
            ("not answering, fenced", self.silent),
            ("changed", self.changed),
        ):
            if ids:
                parts.append(f"{label}: {', '.join(ids)}")
        return "; ".join(parts)


def _members(session: Session) -> list[tuple[Deployment, list[Engine]]]:
    return [
        (deployment, [e for e in engines if e.generation == deployment.generation and e.dp_rank is not None])
        for deployment, engines in deployments_without_a_job(session)
    ]


async def adopt_engines(record: WorkerSessions, fleet: Fleet) -> list[Adoption]:
    """Ask every recorded member, then bring the record in line in one transaction (see module doc)."""
    deployments = await record.run_in_session(_members)
    clients = [
        fleet.client(e.id, e.url, agent_keys_of(deployment))
        for deployment, engines in deployments
        for e in engines
    ]
    answers = await fleet.each(clients, lambda c: c.info()) if clients else {}
    adoptions = [_judge(deployment, engines, answers) for deployment, engines in deployments]
    if any(not a.adopted for a in adoptions):
        await record.run_in_session(lambda s: _correct(s, adoptions, answers))
    for adoption in adoptions:
        if adoption.adopted:
            log.warning("adopted deployment %s as it runs: %s", adoption.deployment, adoption.summary())
        else:
            log.warning("deployment %s not whole at start: %s", adoption.deployment, adoption.summary())
    return adoptions


def _judge(
    deployment: Deployment, engines: Sequence[Engine], answers: dict[str, AgentInfo | AgentCallError]
) -> Adoption:
    adoption = Adoption(deployment.name, deployment.generation, deployment.current_dp_size)
    for engine in engines:
        answer = answers[engine.id]
        if isinstance(answer, AgentUnreachable):
            adoption.gone.append(engine.id)
        elif isinstance(answer, AgentCallError):
            adoption.silent.append(engine.id)
        elif answer.generation == deployment.generation and answer.state.value in SERVING_STATES:
            adoption.serving.append(engine.id)
        else:
            adoption.changed.append(engine.id)
    return adoption


def _correct(
    session: Session, adoptions: Sequence[Adoption], answers: dict[str, AgentInfo | AgentCallError]
) -> None:
    now = utc_now()
    by_name = {a.deployment: a for a in adoptions if not a.adopted}
    for deployment, engines in _members(session):
        adoption = by_name.get(deployment.name)
        if adoption is None:
            continue
        for engine in engines:
            answer = answers.get(engine.id)
            if engine.id in adoption.changed and isinstance(answer, AgentInfo):
                engine.state = EngineState(answer.state.value).value
                engine.generation, engine.dp_rank = answer.generation, answer.rank
                engine.world_size, engine.last_heartbeat_at, engine.updated_at = answer.world_size, now, now
                session.add(engine)
        silent = [e for e in engines if e.id in adoption.silent]
        if silent and len(adoption.serving) == len(engines) - len(silent) and len(silent) == 1:
            # One member does not answer while every other serves the generation with it: it steps
            # with them (a dead one would have broken their group), so the coordinator's link to it is
            # lost, not the engine (`app.deployments.engines.service.mark_unreachable` judges it again later).
            (engine,) = silent
            engine.link_lost_at = engine.last_heartbeat_at or now
            session.add(engine)
        elif silent:
            fence(session, deployment, silent, why="did not answer the coordinator at its start")
    session.commit()
    gone = [engine_id for a in by_name.values() for engine_id in a.gone]
    if gone:
        mark_unreachable(session, silent_since=now, only=gone)
    reconcile_health(session)
