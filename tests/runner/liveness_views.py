"""Views for the liveness judge's table (tests/runner/test_liveness_rules.py): a deployment as one pass
sees it, at a fixed `NOW`, built in a line."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from app.backends.reference.liveness.judge import judge
from app.backends.reference.liveness.verdict import Verdict
from app.backends.reference.liveness.view import DeploymentView, EngineSeen, Hearing, JobSeen, Rules
from app.deployments.models import OnEngineLoss

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
RULES = Rules(heartbeat_timeout_s=15.0, fence_grace_s=15.0, health_confirm_s=2.0, retry_after_s=10.0)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def engine(
    name: str,
    state: str = "serving",
    rank: int | None = None,
    *,
    gen: int | None = None,
    heard: float = 1.0,
    **kw: Any,
) -> EngineSeen:
    """`heard`: seconds since its last heartbeat; `gen`: default 1 with a rank, else 0."""
    gen = gen if gen is not None else (1 if rank is not None else 0)
    return EngineSeen(
        id=name,
        state=state,
        generation=gen,
        dp_rank=rank,
        world_size=0 if rank is None else 2,
        last_heartbeat_at=ago(heard),
        url=f"http://{name}",
        created_at=ago(3600),
        updated_at=ago(heard),
        **kw,
    )


def members(count: int, *, gen: int = 1, heard: float = 1.0, **kw: Any) -> list[EngineSeen]:
    """e0..e{count-1} serving `gen` on ranks 0..count-1."""
    return [engine(f"e{i}", "serving", i, gen=gen, heard=heard, **kw) for i in range(count)]


def job(
    name: str,
    state: str = "succeeded",
    by: str = "self-heal",
    *,
    ended: float = 60.0,
    to_generation: int = 1,
    to_dp_size: int = 2,
) -> JobSeen:
    """`ended`: seconds since it last moved."""
    return JobSeen(
        id=name,
        state=state,
        requested_by=by,
        created_at=ago(ended + 10),
        updated_at=ago(ended),
        to_generation=to_generation,
        to_dp_size=to_dp_size,
    )


def view(
    engines: list[EngineSeen],
    *,
    size: int = 2,
    gen: int = 1,
    status: str = "ready",
    reason: str | None = None,
    since: datetime | None = None,
    policy: str = "replace",
    launcher: str = "local",
    newest: tuple[JobSeen, ...] = (),
    active: JobSeen | None = None,
    newest_heard: float | None = None,
    deaf_at: datetime | None = None,
    watching_since: datetime | None = None,
    **kw: Any,
) -> DeploymentView:
    """A deployment `demo` as one pass sees it; `newest_heard`: seconds since the freshest heartbeat of
    any engine anywhere (default: the freshest of these)."""
    heard = min((e.last_heartbeat_at for e in engines if e.last_heartbeat_at), default=None)
    newest_at = (
        ago(newest_heard)
        if newest_heard is not None
        else max((e.last_heartbeat_at for e in engines if e.last_heartbeat_at), default=heard)
    )
    detail = (
        None
        if reason is None
        else {"reason": reason, "message": "...", "since": (since or ago(30)).isoformat()}
    )
    return DeploymentView(
        id="d1",
        name="demo",
        launcher=launcher,
        policy=OnEngineLoss(policy),
        current_dp_size=size,
        generation=gen,
        status=status,
        status_detail=detail,
        hearing=Hearing(newest_at, watching_since or ago(3600), deaf_at),
        engines=tuple(engines),
        active_job=active,
        newest_jobs=newest,
        **kw,
    )


def verdict(seen: DeploymentView, now: datetime = NOW, rules: Rules = RULES) -> Verdict:
    return judge(seen, now, rules)


def with_engine(seen: DeploymentView, name: str, **changes: Any) -> DeploymentView:
    return replace(seen, engines=tuple(replace(e, **changes) if e.id == name else e for e in seen.engines))
