"""Each deployment's agent key: the credential every agent of the deployment requires on its control
routes (`engine_agent.auth`), made when the deployment is created.

The coordinator must send it, so it is kept sealed (`app.core.sealing`: encrypted under
`EPCTL_SECRET_KEY`, else clear behind a marker), not hashed; agents keep only its SHA-256. Agents the
coordinator launches get it through their environment (`EPCTL_AGENT_KEY`); static agents from the
operator, who reads it once (`reveal`: `epctl deployments agent-key NAME`). A rotation makes a new key,
keeps the previous one for an overlap (sent as a fallback, accepted by agents) and pushes the new key to
every live agent of the deployment, authenticated with the old one (`agent_key_push`: this module
calls no agent, so the record may import it).
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
from engine_agent.protocol import MAX_KEY_OVERLAP_S

KEY_PREFIX = "epak_"
DEFAULT_OVERLAP_S = 3600.0


class AgentKeyShownError(ConflictError):
    code = "agent-key-already-shown"


class AgentKeyRotate(BaseModel):
    overlap_s: float = Field(
        DEFAULT_OVERLAP_S,
        gt=0,
        le=MAX_KEY_OVERLAP_S,
        description="how long agents still accept (and the coordinator still sends) the previous key",
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
        default_factory=dict, description="rotation: agents that could not be told (restart them with it)"
    )


def new_agent_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def give_new_key(deployment: Deployment, chosen: str | None = None) -> None:
    """At creation: every deployment's agent plane has its own key (the operator's `chosen` one, or a
    fresh one), sealed."""
    deployment.agent_key = seal(chosen or new_agent_key())


def agent_keys_of(deployment: Deployment, *, now: datetime | None = None) -> tuple[str, ...]:
    """What an agent call sends: the current key, then the previous one while its overlap lasts."""
    if deployment.agent_key is None:
        return ()
    keys = [unseal(deployment.agent_key)]
    until = deployment.agent_key_previous_until
    if deployment.agent_key_previous and until is not None and (now or utc_now()) < until:
        keys.append(unseal(deployment.agent_key_previous))
    return tuple(keys)


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
class Rotation:
    public: AgentKeyPublic
    new_key: str
    old_keys: tuple[str, ...]
    overlap_s: float
    engines: tuple[tuple[str, str], ...]  # (engine id, url) of the live agents to tell


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
        new_key=new_key,
        old_keys=old_keys,
        overlap_s=body.overlap_s,
        engines=tuple((row.id, row.url) for row in rows),
    )


def _public(deployment: Deployment, *, key: str | None = None) -> AgentKeyPublic:
    assert deployment.agent_key is not None
    until = deployment.agent_key_previous_until
    return AgentKeyPublic(
        deployment=deployment.name,
        key=key or unseal(deployment.agent_key),
        previous_valid_until=until if until is not None and until > utc_now() else None,
    )
