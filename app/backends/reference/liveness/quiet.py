"""When the liveness pass may rest (issue 37: 128 deployments of 16 engines read and judged every second,
a quarter of an idle coordinator's CPU, though a steady fleet's verdicts write nothing).

A pass over a quiet fleet changes nothing, and the next one can only differ if the record moved or time
reached a deadline. Quiet (pure, from the last full pass's views and verdicts): every verdict wrote
nothing, no job runs, every deployment that has a size is `ready` with no self-heal memory, and every
engine is in a live state (registered, serving, idle, paused) with nothing reported against it (no
broken group, unresponsive peer, data link down, control link lost, stuck report, probe, key refused,
shed heartbeat). Then the only rules time alone moves are the silence ones, and `quiet_until` is the
first moment one could fire: an engine's last recorded heartbeat + the heartbeat timeout, the freshest
heartbeat + half of it (deafness). Heartbeats since only move those later, so the bound from the last
full pass is never late. Before it, with nothing this process wrote to the engines, deployments or jobs
since (`app.core.changes`) and within `FULL_PASS_EVERY_S` of the last full pass, a pass is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from app.backends.reference.liveness.verdict import Verdict
from app.backends.reference.liveness.view import LIVE_STATES, DeploymentView, EngineSeen, Rules
from app.deployments.engines.models import Engine
from app.deployments.models import Deployment
from app.jobs.models import ReconfigurationJob

NEVER = datetime.max.replace(tzinfo=UTC)
# The tables a pass reads.
WATCHED = (Engine.__tablename__, Deployment.__tablename__, ReconfigurationJob.__tablename__)


def engine_quiet(engine: EngineSeen) -> bool:
    return (
        engine.state in LIVE_STATES
        and engine.broken_generation is None
        and not engine.unresponsive_peers
        and not engine.data_unreachable
        and engine.link_lost_at is None
        and engine.shed_at is None
        and not engine.refuses_agent_key
        and engine.stuck is None
        and engine.probed is None
        and engine.process_gone is None
        and engine.asked is None
    )


def view_quiet(view: DeploymentView, verdict: Verdict) -> bool:
    if not verdict.writes_nothing or verdict.deaf or verdict.broken_since is not None:
        return False
    if view.active_job is not None or view.at_start or view.broken_since is not None:
        return False
    if view.current_dp_size > 0 and (
        view.status != "ready" or view.heal_lost or view.heal_target_dp_size is not None
    ):
        return False
    return all(engine_quiet(e) for e in view.engines)


def quiet_until(
    views: Sequence[DeploymentView], verdicts: Sequence[Verdict], rules: Rules
) -> datetime | None:
    """The first moment a pass over a fleet as quiet as these views could write something by time alone,
    or None where it is not quiet (the next pass runs in full); `NEVER` where no engine heartbeated yet
    (none can fall silent: silence counts from a recorded heartbeat)."""
    if len(views) != len(verdicts) or not all(view_quiet(v, d) for v, d in zip(views, verdicts, strict=True)):
        return None
    timeout = timedelta(seconds=rules.heartbeat_timeout_s)
    deadlines = [e.last_heartbeat_at + timeout for v in views for e in v.engines if e.last_heartbeat_at]
    newest = views[0].hearing.newest_heartbeat_at if views else None
    if newest is not None:
        deadlines.append(newest + timeout / 2)
    return min(deadlines, default=NEVER)


__all__ = ["WATCHED", "engine_quiet", "quiet_until", "view_quiet"]
