"""Engine registration and heartbeats, HTTP-free. What the heartbeats mean (lost, stalled, a lost link)
is judged above the record, by the deployment's backend (`app.backends.reference.liveness`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core import changes
from app.core.clock import utc_now
from app.core.errors import ConflictError, NotFoundError
from app.core.sealing import SealingError
from app.deployments.agent_keys import SealedKeys, key_verdicts
from app.deployments.coverage import coverage_condition
from app.deployments.engines.fenced import left_behind_by
from app.deployments.engines.models import Engine, EngineState, refuses_key
from app.deployments.engines.steady import steady_statement
from app.deployments.incidents import service as incidents
from app.deployments.models import Condition, Deployment
from app.deployments.service import get_deployment
from engine_agent.protocol import AgentHeartbeat, AgentInfo, AgentRegistration, EngineConfig

log = logging.getLogger(__name__)


class EngineNotFoundError(NotFoundError):
    code = "engine-not-found"


def register_engine(session: Session, *, registration: AgentRegistration) -> tuple[Engine, bool]:
    """Create or update (same engine_id: idempotent). Returns (engine, created)."""
    deployment = get_deployment(session, ref=registration.deployment)
    if deployment.backend != "reference":
        raise ConflictError(
            f"deployment {deployment.name!r} runs backend {deployment.backend}: its engines are not epctl "
            "agents and do not register",
            code="backend-mismatch",
            engine_id=registration.engine_id,
        )
    expected = EngineConfig.model_validate(deployment.engine_config)
    if registration.engine.model_dump() != expected.model_dump():
        raise ConflictError(
            f"engine {registration.engine_id} runs another engine config than deployment "
            f"{deployment.name!r}: {registration.engine.model_dump()} != {expected.model_dump()}",
            code="engine-config-mismatch",
            engine_id=registration.engine_id,
        )
    now = utc_now()
    engine = session.get(Engine, registration.engine_id)
    created = engine is None
    if engine is None:
        engine = Engine(
            id=registration.engine_id,
            deployment_id=deployment.id,
            url=registration.url,
            platform=registration.platform.value,
            device=registration.device,
            launched_by=deployment.launcher,
            created_at=now,
        )
    elif engine.deployment_id != deployment.id and engine.state != EngineState.left:
        raise ConflictError(
            f"engine {engine.id} is registered with another deployment; deregister it there first",
            code="engine-in-other-deployment",
            engine_id=engine.id,
        )
    engine.deployment_id = deployment.id
    engine.url = registration.url
    engine.platform = registration.platform.value
    engine.device = registration.device
    engine.generation = registration.generation
    engine.dp_rank = registration.rank
    engine.state = EngineState.registered.value
    engine.launched_by = deployment.launcher
    engine.pid, engine.hostname = registration.pid, registration.hostname
    engine.data_host = registration.data_host
    engine.last_heartbeat_at = now
    engine.updated_at = now
    session.add(engine)
    try:
        session.commit()
    except IntegrityError:
        # The runner (or a concurrent retry) inserted this engine_id first: register over that row.
        session.rollback()
        if not created:
            raise
        return register_engine(session, registration=registration)[0], False
    return engine, created


def record_heartbeat(
    session: Session,
    *,
    engine_id: str,
    heartbeat: AgentHeartbeat,
    on_break: Callable[[Session, Engine], None] | None = None,
) -> Engine:
    """Write what the engine reports; commits. `on_break(session, engine)` runs in the same transaction
    when this heartbeat is the first to report its group broken (`reported_break_now`): what that means for
    the deployment's status is its backend's to judge (`DeploymentReactions.group_broke`), and it commits
    with the report, so no reader sees the engine out of its group while the deployment reads `ready`."""
    engine = get_engine(session, engine_id=engine_id)
    if engine.state == EngineState.left:
        raise ConflictError(
            f"engine {engine_id} has left; register it again", code="engine-left", engine_id=engine_id
        )
    now = utc_now()
    if heartbeat.group_error and engine.state != heartbeat.state.value:
        log.warning("engine %s left generation %s: %s", engine_id, engine.generation, heartbeat.group_error)
    # A fenced engine comes back only once its data network reaches its peers again (a broken data
    # link leaves it heartbeating over the control network): until then it stays out of every job.
    cut_off = engine.state == EngineState.fenced.value and bool(heartbeat.data_unreachable)
    # A frozen engine fenced while its peers left its group may thaw still on that group (its last
    # collective can complete against a peer's abandoned one): it stays fenced, off any rank, until
    # it leaves that generation by itself (issue 39: no stale generation comes back as serving).
    left_behind = engine.state == EngineState.fenced.value and left_behind_by(session, engine, heartbeat)
    if left_behind:
        log.warning("fenced engine %s still reports generation %s, which re-formed without it", engine_id,
                    heartbeat.generation)  # fmt: skip
    if not cut_off and not left_behind:
        engine.state = EngineState(heartbeat.state.value).value
    if not left_behind:
        engine.generation = heartbeat.generation
        engine.dp_rank = heartbeat.rank
        engine.world_size = heartbeat.world_size
    if heartbeat.broken_generation is None:
        engine.broken_generation, engine.unresponsive_peers, engine.broken_reported_at = None, None, None
        engine.broken_last_step_at = None
    else:
        if engine.broken_generation != heartbeat.broken_generation:
            engine.broken_reported_at = now
        engine.broken_generation = heartbeat.broken_generation
        engine.unresponsive_peers = list(heartbeat.unresponsive_peers) or None
        last_step = heartbeat.broken_last_step_at
        engine.broken_last_step_at = (
            min(datetime.fromtimestamp(last_step, UTC), now) if last_step is not None else None
        )
    engine.group_steps = heartbeat.group_steps
    engine.data_unreachable = list(heartbeat.data_unreachable) or None
    _judge_key(session, engine, heartbeat.key_check, now)
    if engine.link_lost_at is not None:
        log.warning(
            "engine %s heard from again (its control link was lost since %s)", engine_id, engine.link_lost_at
        )
        engine.link_lost_at = None
    engine.last_heartbeat_at = now
    engine.updated_at = now
    session.add(engine)
    if on_break is not None and reported_break_now(engine):
        on_break(session, engine)  # may open the incident the next lines note the loss on
    if engine.broken_generation is not None and engine.broken_last_step_at is not None:
        # The survivors' record of when their group last served: the loss, for the open incident.
        incidents.note_group_broke(
            session, engine.deployment_id, engine.broken_generation, engine.broken_last_step_at
        )
    session.commit()
    return engine


def reported_break_now(engine: Engine) -> bool:
    """The heartbeat `record_heartbeat` just wrote was the first to report its group broken (the report
    time is set to this heartbeat's only when the broken generation is news)."""
    return engine.broken_generation is not None and engine.broken_reported_at == engine.last_heartbeat_at


def record_steady_heartbeat(
    session: Session, *, engine_id: str, heartbeat: AgentHeartbeat
) -> Row[Any] | None:
    """The heartbeat of an engine whose record it only renews (no broken group, no data link down, no
    control link lost, the key verdict unchanged): one statement that writes it and reads back the row
    with its deployment's name and keys, then the commit (issue 37: 700 heartbeats a second). None, with
    nothing written, when it needs `record_heartbeat` (what this path leaves out, that one does). The
    coordinator writes these in batches (`batch.HeartbeatBatches`: one commit for many)."""
    now = utc_now()
    params = steady_params(engine_id, heartbeat, now)
    if params is None:
        return None
    # On the session's connection, past the ORM's statement handling (no object is loaded here).
    row = session.connection().execute(steady_statement(), params).one_or_none()
    if row is None or key_verdict_moves(row, heartbeat.key_check, now):
        session.rollback()
        return None
    session.commit()
    changes.note_steady([row])  # past the ORM's events: a pass wakes only where its facts moved
    return row


def is_steady(heartbeat: AgentHeartbeat) -> bool:
    """Whether the heartbeat may only renew its engine's record (its engine's row decides the rest)."""
    broken = heartbeat.broken_generation is not None or heartbeat.group_error
    return not broken and not heartbeat.data_unreachable


def steady_params(engine_id: str, heartbeat: AgentHeartbeat, now: datetime) -> dict[str, Any] | None:
    """`steady_statement`'s parameters for this heartbeat, or None when it is not a steady one."""
    if not is_steady(heartbeat):
        return None
    values = {
        "state": EngineState(heartbeat.state.value).value,
        "generation": heartbeat.generation,
        "dp_rank": heartbeat.rank,
        "world_size": heartbeat.world_size,
        "group_steps": heartbeat.group_steps,
        "last_heartbeat_at": now,
        "updated_at": now,
    }
    return {"engine_id": engine_id, **{f"new_{name}": value for name, value in values.items()}}


def key_verdict_moves(row: Row[Any], reported: str | None, now: datetime) -> bool:
    if row.agent_key is None:
        return False
    sealed = SealedKeys(row.agent_key, row.agent_key_previous, row.agent_key_previous_until)
    try:
        refused = key_verdicts.refused(sealed, reported, now)
    except SealingError:
        return False  # as `_judge_key`: nothing to compare
    return refused != (row.key_refused_at is not None)


def _judge_key(session: Session, engine: Engine, reported: str | None, now: datetime) -> None:
    """`key_refused_at` from the key the engine reports holding (`holds_another_key`)."""
    deployment = session.get(Deployment, engine.deployment_id)
    if deployment is None or deployment.agent_key is None:
        return
    sealed = SealedKeys(
        deployment.agent_key, deployment.agent_key_previous, deployment.agent_key_previous_until
    )
    try:
        refused = key_verdicts.refused(sealed, reported, now)
    except SealingError:
        return  # the coordinator cannot open its own key: nothing to compare (its start said so)
    if refused and engine.key_refused_at is None:
        engine.key_refused_at = now
        log.warning(
            "engine %s of %s holds another agent key than the coordinator's: it refuses every call "
            "(rotate the key to restart it: `epctl deployments agent-key %s --rotate`)",
            engine.id,
            deployment.name,
            deployment.name,
        )
    elif not refused and engine.key_refused_at is not None:
        engine.key_refused_at = None
        log.warning("engine %s of %s accepts the coordinator's agent key again", engine.id, deployment.name)


def mark_key_refused(session: Session, engine_ids: Collection[str], *, refused: bool) -> None:
    """A call with the coordinator's keys answered 401 (`refused`), or a push went through: recorded
    at once (the next heartbeat confirms either); commits."""
    now = utc_now()
    for engine_id in engine_ids:
        engine = session.get(Engine, engine_id)
        if engine is None:
            continue
        if refused and engine.key_refused_at is None:
            engine.key_refused_at, engine.updated_at = now, now
        elif not refused and engine.key_refused_at is not None:
            engine.key_refused_at, engine.updated_at = None, now
        session.add(engine)
    session.commit()


def deregister_engine(session: Session, *, engine_id: str) -> Engine:
    """Marks it `left` (kept for history; never picked again)."""
    engine = get_engine(session, engine_id=engine_id)
    engine.state = EngineState.left.value
    engine.dp_rank = None
    engine.updated_at = utc_now()
    session.add(engine)
    session.commit()
    return engine


def prune_left_engines(session: Session, *, older_than: datetime) -> int:
    """Delete engines that left (scaled away, written off, deregistered) before `older_than`; returns how
    many. Jobs name their engines by id in their own records, so the history survives this."""
    result = session.execute(
        sa.delete(Engine).where(
            col(Engine.state) == EngineState.left.value, col(Engine.updated_at) < older_than
        )
    )
    session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def get_engine(session: Session, *, engine_id: str) -> Engine:
    engine = session.get(Engine, engine_id)
    if engine is None:
        raise EngineNotFoundError(f"no engine {engine_id!r}", engine_id=engine_id)
    return engine


def list_engines(
    session: Session, *, deployment: str | None = None, state: EngineState | None = None
) -> list[Engine]:
    statement = select(Engine)
    if deployment is not None:
        statement = statement.where(Engine.deployment_id == get_deployment(session, ref=deployment).id)
    if state is not None:
        statement = statement.where(Engine.state == state.value)
    return list(session.exec(statement.order_by(col(Engine.deployment_id), col(Engine.id))).all())


def available_engines(session: Session, *, deployment_id: str) -> list[Engine]:
    """The engines a job may use: registered with the deployment and not `left`."""
    return list(
        session.exec(
            select(Engine)
            .where(Engine.deployment_id == deployment_id, Engine.state != EngineState.left.value)
            .order_by(col(Engine.dp_rank).is_(None), col(Engine.dp_rank), col(Engine.created_at))
        ).all()
    )


def conditions(session: Session, *, deployment_id: str) -> list[Condition]:
    """The deployment's members the coordinator cannot hear while their group steps, and its engines
    that refuse the coordinator's agent key."""
    return conditions_of(session, [deployment_id]).get(deployment_id, [])


def conditions_of(session: Session, deployment_ids: Collection[str]) -> dict[str, list[Condition]]:
    """`conditions` of each of these deployments that has any, by id (two queries for any number):
    coverage at risk (from the stored coverage), then members whose control link is lost and engines
    that refuse the coordinator's agent key."""
    if not deployment_ids:
        return {}
    flagged = session.exec(
        select(Engine)
        .where(
            col(Engine.deployment_id).in_(list(deployment_ids)),
            sa.or_(col(Engine.link_lost_at).is_not(None), col(Engine.key_refused_at).is_not(None)),
        )
        .order_by(col(Engine.id))
    ).all()
    found: dict[str, list[Condition]] = {}
    for deployment in session.exec(
        select(Deployment).where(
            col(Deployment.id).in_(list(deployment_ids)), col(Deployment.coverage).is_not(None)
        )
    ).all():
        redundant = int(deployment.engine_config.get("num_redundant_experts") or 0)
        at_risk = coverage_condition(deployment.coverage, num_redundant=redundant)
        if at_risk is not None:
            found.setdefault(deployment.id, []).append(at_risk)
    for engine in flagged:
        if engine.link_lost_at is not None:
            found.setdefault(engine.deployment_id, []).append(
                Condition(
                    type="engine-unreachable-from-coordinator",
                    engine_id=engine.id,
                    since=engine.link_lost_at,
                    message=f"{engine.id} is not heard by the coordinator, but its group steps: its control "
                    "link is lost, the engine serves; no self-heal, and jobs wait until it is heard again",
                )
            )
        if refuses_key(engine) and engine.key_refused_at is not None:
            found.setdefault(engine.deployment_id, []).append(
                Condition(
                    type="engine-refuses-agent-key",
                    engine_id=engine.id,
                    since=engine.key_refused_at,
                    message=f"{engine.id} refuses the coordinator's agent key (it holds another one): no job "
                    "can reach it and it counts as no member. Rotate the key (`epctl deployments agent-key "
                    "NAME --rotate`): an engine of the local or Ray launcher is restarted with the new key "
                    "(self-healing replaces it); a static agent must be restarted by its operator with it",
                )
            )
    return found


def deployment_names(session: Session, deployment_ids: set[str]) -> dict[str, str]:
    if not deployment_ids:
        return {}
    rows = session.exec(select(Deployment.id, Deployment.name).where(col(Deployment.id).in_(deployment_ids)))
    return dict(rows.all())


def record_launched(
    session: Session, deployment_id: str, launched_by: str, infos: Collection[AgentInfo]
) -> None:
    """Record engines a launcher just started (idle) where they have not registered themselves yet."""
    for info in infos:
        if session.get(Engine, info.engine_id) is not None:
            continue
        session.add(
            Engine(
                id=info.engine_id,
                deployment_id=deployment_id,
                url=info.url,
                platform=info.platform.value,
                device=info.device,
                state=EngineState.idle.value,
                launched_by=launched_by,
            )
        )
        try:
            session.commit()
        except IntegrityError:
            session.rollback()  # it registered itself meanwhile
