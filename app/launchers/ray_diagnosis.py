"""Ray's account of a launch that failed or an engine that was lost, as one readable sentence.

Errors name the engine and Ray's cause: the placement group's scheduling state and the cluster's free
resources, or the actor's death cause from Ray's state API (killed, node lost, worker crashed). `ray`
is passed in by the caller, never imported here at module level.
"""

from __future__ import annotations

import time
from typing import Any

from app.launchers.base import LaunchError

CAUSE_MAX_CHARS = 700


def one_line(text: str, limit: int = CAUSE_MAX_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def resources_text(values: dict[str, float]) -> str:
    """Ray resources as an operator reads them: no per-node markers, no placement-group bookkeeping
    (`CPU_group_...`), memory in GiB."""
    shown: list[str] = []
    for name, amount in sorted(values.items()):
        if name.startswith("node:") or "_group_" in name or name == "object_store_memory":
            continue
        shown.append(f"memory: {amount / 2**30:.1f} GiB" if name == "memory" else f"{name}: {amount:g}")
    return "{" + ", ".join(shown) + "}"


def death_cause_text(cause: Any) -> str:
    """Ray's `ActorDeathCause` (a dict in the state API) as one sentence."""
    if not isinstance(cause, dict):
        return one_line(str(cause))
    for context in cause.values():
        if not isinstance(context, dict):
            continue
        parts = [str(context.get("error_message") or context.get("formatted_exception_string") or "")]
        node_death = context.get("node_death_info")
        if isinstance(node_death, dict) and node_death:
            parts.append(f"node death: {node_death.get('reason', '')} {node_death.get('reason_message', '')}")
        if context.get("reason"):
            parts.append(f"reason {context['reason']}")
        text = "; ".join(p.strip() for p in parts if p and p.strip())
        if text:
            return one_line(text)
    return one_line(str(cause))


def launch_error(ray: Any, engine_id: str, exc: BaseException, wait_s: float, namespace: str) -> LaunchError:
    """What went wrong while waiting for an engine's agent to serve, with a `type` per Ray cause."""
    from ray import exceptions as rex

    if isinstance(exc, rex.GetTimeoutError):
        return LaunchError(
            f"engine {engine_id}: its Ray actor did not report the agent serving within {wait_s:.1f}s",
            engine_id,
            type_="ray-launch-timeout",
        )
    if isinstance(exc, rex.RuntimeEnvSetupError):
        return LaunchError(
            f"engine {engine_id}: Ray could not set up its runtime_env: {one_line(str(exc))}",
            engine_id,
            type_="ray-runtime-env-failed",
        )
    if isinstance(exc, rex.RayActorError):
        # The exception may only say "unavailable"; Ray's record of the actor says why (killed,
        # node lost, worker crashed) once it has marked it dead.
        story = death_story(ray, engine_id, namespace) or (
            f"no cause recorded yet ({actor_story(ray, engine_id, namespace)}; Ray declares a lost node "
            "dead only once its health checks fail)"
        )
        return LaunchError(
            f"engine {engine_id}: its Ray actor died: {one_line(str(exc), 300)}; Ray: {story}",
            engine_id,
            type_="ray-actor-died",
        )
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        return LaunchError(f"engine {engine_id}: {one_line(str(cause))}", engine_id, type_="ray-agent-failed")
    return LaunchError(
        f"engine {engine_id}: {exc.__class__.__name__}: {one_line(str(exc))}",
        engine_id,
        type_="ray-error",
    )


def death_story(ray: Any, engine_id: str, namespace: str, wait_s: float = 10.0) -> str | None:
    """Ray's death cause for the actor, waiting a little for Ray to record it; None if it does not."""
    give_up = time.monotonic() + wait_s
    while True:
        story = actor_story(ray, engine_id, namespace)
        if " is DEAD" in story or time.monotonic() >= give_up:
            return story if " is DEAD" in story else None
        time.sleep(0.5)


def actor_story(ray: Any, engine_id: str, namespace: str) -> str:
    """Ray's word on an engine's actor: alive (and on which node), or dead and why."""
    try:
        from ray.util.state import list_actors

        found = list_actors(
            filters=[("name", "=", engine_id), ("ray_namespace", "=", namespace)], detail=True, limit=10
        )
    except Exception:  # the state API needs the dashboard; without it Ray can only say alive or not
        found = []
    if found:
        actor = sorted(found, key=lambda a: a.state == "ALIVE")[-1]
        if actor.state == "ALIVE":
            return f"its Ray actor {actor.actor_id} is alive on node {actor.node_id}"
        cause = death_cause_text(actor.death_cause) if actor.death_cause else "no cause recorded"
        return f"its Ray actor {actor.actor_id} is {actor.state}: {cause}"
    try:
        ray.get_actor(engine_id, namespace=namespace)
    except ValueError:
        return f"no live Ray actor named {engine_id} in namespace {namespace}"
    return f"its Ray actor {engine_id} is alive"
