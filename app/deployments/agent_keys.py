"""Each deployment's agent key: the credential every agent of the deployment requires on its control
routes (`engine_agent.auth`), made when the deployment is created.

The coordinator must send it, so it is kept sealed (`app.core.sealing`: encrypted under
`EPCTL_SECRET_KEY`, else clear behind a marker), not hashed; agents keep only its SHA-256. Agents the
coordinator launches get it through their environment (`EPCTL_AGENT_KEY`); static agents from the
operator, who reads it once (`reveal`: `epctl deployments agent-key NAME`). A rotation makes a new key,
keeps the previous one for an overlap (sent as a fallback, accepted by agents) and pushes the new key to
every live agent of the deployment, authenticated with the old one (`agent_key_push`: this module
calls no agent, so the record may import it).

A previous key always has an end: the record's `agent_key_previous_until`. Agents launched during an
overlap get it with the key (`EPCTL_AGENT_KEY_PREVIOUS_UNTIL`), pushed agents the overlap; after it,
the key opens nothing anywhere. An engine that holds another key than the coordinator sends (its
heartbeat's `key_check` matches neither the current key nor the previous one within its overlap)
refuses the coordinator: recorded as the engine's `key_refused_at` and shown as
the deployment's condition `engine-refuses-agent-key` (`holds_another_key` is the rule).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.core.errors import ConflictError
from app.core.sealing import seal, unseal
from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment
from engine_agent.protocol import MAX_KEY_OVERLAP_S, MIN_KEY_OVERLAP_S, key_check

KEY_PREFIX = "epak_"
DEFAULT_OVERLAP_S = 3600.0


class AgentKeyShownError(ConflictError):
    code = "agent-key-already-shown"


class AgentKeyRotate(BaseModel):
    overlap_s: float = Field(
        DEFAULT_OVERLAP_S,
        ge=MIN_KEY_OVERLAP_S,
        le=MAX_KEY_OVERLAP_S,
        description="how long agents still accept (and the coordinator still sends) the previous key; "
        "then it opens nothing, on any engine (10 s to 7 days)",
    )


class AgentKeyPublic(BaseModel):
    """A deployment's agent key, shown once: give it to static agents as `EPCTL_AGENT_KEY`."""

    deployment: str
    key: str = Field(description="the agent key (EPCTL_AGENT_KEY); shown only in this answer")
    previous_valid_until: datetime | None = Field(
        None, description="during a rotation: until when the previous key is still accepted"
    )
    pushed_to: list[str] = Field(default_factory=list, description="rotation: agents told the new key")
    not_pushed: dict[str, str] = Field(
        default_factory=dict, description="rotation: agents that could not be told, and why"
    )
    restarted: list[str] = Field(
        default_factory=list,
        description="rotation: engines that refuse the coordinator's key, stopped by the launcher that "
        "started them (local, Ray): self-healing replaces them with engines that hold the new key",
    )
    restart_by_operator: list[str] = Field(
        default_factory=list,
        description="rotation: static agents that refuse the coordinator's key: restart each with the new "
        "key (EPCTL_AGENT_KEY)",
    )


def new_agent_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def give_new_key(deployment: Deployment, chosen: str | None = None) -> None:
    """At creation: every deployment's agent plane has its own key (the operator's `chosen` one, or a
    fresh one), sealed."""
    deployment.agent_key = seal(chosen or new_agent_key())


def agent_keys_of(deployment: Deployment, *, now: datetime | None = None) -> tuple[str, ...]:
    """What an agent call sends: the current key, then the previous one while its overlap lasts."""
    sealed = SealedKeys(
        deployment.agent_key, deployment.agent_key_previous, deployment.agent_key_previous_until
    )
    return sealed.keys(now or utc_now())


@dataclass(frozen=True)
class SealedKeys:
    """A deployment's agent keys as stored (sealed): what `agent_keys_of` opens."""

    current: str | None
    previous: str | None
    previous_until: datetime | None

    def keys(self, now: datetime) -> tuple[str, ...]:
        if self.current is None:
            return ()
        keys = [unseal(self.current)]
        if self.previous and self.previous_until is not None and now < self.previous_until:
            keys.append(unseal(self.previous))
        return tuple(keys)

    def verdict_until(self, now: datetime) -> datetime | None:
        """Until when a verdict on these keys holds: the previous key's end while it counts, else for
        good (a rotation stores other sealed keys, so it asks again)."""
        until = self.previous_until
        return until if self.previous and until is not None and now < until else None


def previous_until_epoch(deployment: Deployment, *, now: datetime | None = None) -> float | None:
    """When the previous key's overlap ends (wall-clock epoch seconds), while it lasts; None otherwise."""
    until = deployment.agent_key_previous_until
    if deployment.agent_key_previous and until is not None and (now or utc_now()) < until:
        return until.timestamp()
    return None


def holds_another_key(reported: str | None, keys: tuple[str, ...]) -> bool:
    """Whether an engine whose heartbeat reports `reported` (its current key's `key_check`; None: it
    needs no key) refuses the coordinator, which sends `keys` (`agent_keys_of`: the current key, then
    the previous one while its overlap lasts). An engine still on the previous key within the overlap
    does not refuse yet (it is told at the push, or refuses once the overlap ends)."""
    if reported is None or not keys:
        return False
    return all(key_check(key) != reported for key in keys)


class KeyVerdicts:
    """`holds_another_key` per (stored keys, reported key check), kept until the keys change: a
    heartbeat's key check without opening the sealed keys each time (issue 37: 700 heartbeats a second).
    Keyed by the sealed keys themselves, so a rotation (by any coordinator sharing the database) asks
    again at once; a verdict taken while a previous key counts ends with that key's overlap. A key that
    does not open (`SealingError`) is never kept. Bounded: cleared when full."""

    MAX_ENTRIES = 20_000

    def __init__(self) -> None:
        self._verdicts: dict[tuple[SealedKeys, str | None], tuple[bool, datetime | None]] = {}

    def refused(self, sealed: SealedKeys, reported: str | None, now: datetime) -> bool:
        """Whether the engine reporting `reported` refuses the coordinator (raises `SealingError`)."""
        entry = self._verdicts.get((sealed, reported))
        if entry is not None and (entry[1] is None or now < entry[1]):
            return entry[0]
        refused = holds_another_key(reported, sealed.keys(now))
        if len(self._verdicts) >= self.MAX_ENTRIES:
            self._verdicts.clear()
        self._verdicts[(sealed, reported)] = (refused, sealed.verdict_until(now))
        return refused


key_verdicts = KeyVerdicts()  # this coordinator's (the heartbeats')


def ensure_agent_key(session: Session, deployment: Deployment) -> None:
    """A deployment made before agent keys existed gets one now (its agents need restarting with it)."""
    if deployment.agent_key is None:
        give_new_key(deployment)
        session.add(deployment)
        session.commit()
        session.refresh(deployment)


def reveal(session: Session, deployment: Deployment) -> AgentKeyPublic:
    """The current key, once: a second call is refused (rotate to get a new one)."""
    ensure_agent_key(session, deployment)
    if deployment.agent_key_shown_at is not None:
        raise AgentKeyShownError(
            f"the agent key of {deployment.name!r} was shown at {deployment.agent_key_shown_at.isoformat()}; "
            f"rotate it to see a new one (`epctl deployments agent-key {deployment.name} --rotate`)",
            deployment=deployment.name,
        )
    deployment.agent_key_shown_at = utc_now()
    session.add(deployment)
    session.commit()
    session.refresh(deployment)
    return _public(deployment)


@dataclass(frozen=True)
class RotatedEngine:
    """A live agent of the deployment, to tell (and, if it refuses, to restart)."""

    engine_id: str
    url: str
    pid: int | None
    launched_by: str


@dataclass(frozen=True)
class Rotation:
    public: AgentKeyPublic
    deployment: str
    new_key: str
    old_keys: tuple[str, ...]
    overlap_s: float
    engines: tuple[RotatedEngine, ...]


def rotate(session: Session, deployment: Deployment, body: AgentKeyRotate) -> Rotation:
    """A new current key; the old one stays valid for `overlap_s` (also for agents not told yet)."""
    ensure_agent_key(session, deployment)
    old_keys = agent_keys_of(deployment)
    assert deployment.agent_key is not None
    new_key = new_agent_key()
    now = utc_now()
    deployment.agent_key_previous = deployment.agent_key
    deployment.agent_key_previous_until = now + timedelta(seconds=body.overlap_s)
    deployment.agent_key = seal(new_key)
    deployment.agent_key_shown_at = now
    session.add(deployment)
    session.commit()
    session.refresh(deployment)
    rows = session.exec(
        select(Engine).where(
            Engine.deployment_id == deployment.id, col(Engine.state) != EngineState.left.value
        )
    ).all()
    return Rotation(
        public=_public(deployment, key=new_key),
        deployment=deployment.name,
        new_key=new_key,
        old_keys=old_keys,
        overlap_s=body.overlap_s,
        engines=tuple(
            RotatedEngine(row.id, row.url, row.pid, row.launched_by or deployment.launcher) for row in rows
        ),
    )


def _public(deployment: Deployment, *, key: str | None = None) -> AgentKeyPublic:
    assert deployment.agent_key is not None
    until = deployment.agent_key_previous_until
    return AgentKeyPublic(
        deployment=deployment.name,
        key=key or unseal(deployment.agent_key),
        previous_valid_until=until if until is not None and until > utc_now() else None,
    )
