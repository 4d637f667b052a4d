"""Adoption: a coordinator that starts asks, once, whether the engines the record names still serve.

Engines outlive their coordinator (serving never depends on it), so a coordinator that starts (after a
crash, a slow restart, or beside a dead one of an HA pair) finds deployments whose record says `ready`
at some size. It asks every recorded member of each deployment no job runs for `/v1/info`, at once, and
the answers are one more observation for the judge (`judge.answers`):

- serving (or paused) on the recorded generation: adopted;
- something else (idle: its group broke meanwhile; another generation): its record takes what it says;
- nothing listens (connection refused): gone, lost now, and self-healing acts;
- no answer within the agent call deadline: fenced (out of the generation, not stopped); but the one
  member that does not answer while every other serves the generation with it is stepping with them:
  only the coordinator's link to it is lost (a condition; the heartbeat expiry judges it again).

So a deployment is never `ready` with a member that does not answer. The outcome per deployment is
logged, and kept (`Liveness.adoption`) for `epctl up`, which reports "adopted" only when it is true.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from app.agents.errors import AgentCallError, AgentUnreachable
from app.agents.fleet import Fleet
from app.backends.reference.liveness.observe import members
from app.backends.reference.liveness.view import Answer, Asked, DeploymentView
from app.deployments.engines.models import SERVING_STATES
from engine_agent.protocol import AgentInfo


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


def asked(view: DeploymentView, answer: AgentInfo | AgentCallError) -> Asked:
    """One member's answer as the judge reads it."""
    if isinstance(answer, AgentUnreachable):
        return Asked(Answer.gone)
    if isinstance(answer, AgentCallError):
        return Asked(Answer.silent)
    if answer.generation == view.generation and answer.state.value in SERVING_STATES:
        return Asked(Answer.serving)
    return Asked(Answer.changed, answer.state.value, answer.generation, answer.rank, answer.world_size)


def adoption_of(view: DeploymentView, answers: Mapping[str, Asked]) -> Adoption:
    adoption = Adoption(view.name, view.generation, view.current_dp_size)
    lists = {
        Answer.serving: adoption.serving,
        Answer.changed: adoption.changed,
        Answer.gone: adoption.gone,
        Answer.silent: adoption.silent,
    }
    for engine in members(view):
        if engine.id in answers:
            lists[answers[engine.id].answer].append(engine.id)
    return adoption


async def ask_members(
    views: list[DeploymentView], fleet: Fleet, keys: Mapping[str, list[str]]
) -> dict[str, dict[str, Asked]]:
    """Every member of these views asked `GET /v1/info` at once: deployment id -> engine id -> answer."""
    clients = [fleet.client(e.id, e.url, keys[view.id]) for view in views for e in members(view)]
    answers = await fleet.each(clients, lambda c: c.info()) if clients else {}
    return {
        view.id: {e.id: asked(view, answers[e.id]) for e in members(view) if e.id in answers}
        for view in views
    }
