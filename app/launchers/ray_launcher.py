"""The Ray launcher (`launcher: ray`): each engine is a detached named actor on a Ray cluster.

A scale-up that needs N new engines reserves one placement group of N bundles (the deployment's
`placement_strategy` across them, each bundle what one engine asks for), then starts one
`engine_agent.ray_host.AgentHost` actor per bundle, named after its engine id in the deployment's Ray
namespace, detached (it outlives the coordinator) and never restarted by Ray. The actor runs
`epctl-agent` as its child process; the agent registers with the coordinator as any other would.

- Names: engine `<deployment>-<batch>-<i>`, placement group `<namespace>/<deployment>-<batch>`. A
  restarted coordinator finds its engines by name (`ray.get_actor`), stops them on release, and
  removes a placement group once none of its actors is left.
- Failures name the engine and Ray's cause: no resources within `placement_timeout_s` (with Ray's
  scheduling state and the cluster's free resources), the actor died (Ray's death cause), the agent
  exited, the runtime environment failed. Whatever the failed call started is stopped again.
- Orphans: an actor of this deployment that the database does not know (its coordinator died while
  launching it) or knows as `left` is stopped at the next launch.

`ray` is imported on first use only: a coordinator without Ray deployments never loads it. All Ray
calls block, so they run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment, ray_settings_of
from app.launchers.agent_args import deployment_agent_args
from app.launchers.base import EngineHandle, Launcher, LaunchError, LaunchSpec
from app.launchers.ray_diagnosis import actor_story, launch_error, one_line, resources_text
from app.launchers.ray_settings import RaySettings

log = logging.getLogger(__name__)

T = TypeVar("T")
RAY_THREADS = 4  # Ray calls block for up to a placement timeout: they get threads of their own
DRIVER_NAMESPACE = "epctl-coordinator"  # the coordinator's own Ray namespace (placement group names)
STOP_GRACE_S = 3.0


def agent_args(spec: LaunchSpec, settings: RaySettings) -> list[str]:
    """The agent's arguments after host/port/engine id; the token goes through the environment. The
    data address is the node's interface `data_interface` names (its back-end fabric), else the
    control address."""
    data = ["--data-interface", settings.data_interface] if settings.data_interface else []
    return deployment_agent_args(spec, ["--platform", settings.engine_platform().value, *data])


@dataclass
class Batch:
    """The engines one `ensure_engines` call starts: one placement group, one actor per bundle."""

    spec: LaunchSpec
    settings: RaySettings
    batch_id: str
    engine_ids: list[str]
    abandoned: bool = False  # the caller gave up (cancelled): discard whatever gets started
    actors: dict[str, Any] = field(default_factory=dict)

    @property
    def group_name(self) -> str:
        return f"{self.settings.namespace}/{self.spec.deployment}-{self.batch_id}"


class RayLauncher(Launcher):
    name = "ray"

    def __init__(self, db: DbEngine, *, stop_grace_s: float = STOP_GRACE_S) -> None:
        self.db = db
        self.stop_grace_s = stop_grace_s
        self._address: str | None = None  # the cluster this coordinator's Ray driver is connected to
        self._connect_lock = threading.Lock()
        self._launching: set[str] = set()  # engine ids being started right now (not orphans)
        # Not the event loop's default executor: a slow launch must not hold up the runner's database
        # work, which runs there.
        self._executor = ThreadPoolExecutor(max_workers=RAY_THREADS, thread_name_prefix="ray-launcher")

    async def _in_thread(self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(work, *args)
        )

    # --- the interface ----------------------------------------------------------------------------

    async def ensure_engines(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> list[EngineHandle]:
        chosen = list(idle[:count])
        missing = count - len(chosen)
        if missing <= 0:
            return chosen
        settings = await self._in_thread(self.settings_for, spec.deployment)
        batch_id = uuid.uuid4().hex[:8]
        batch = Batch(
            spec=spec,
            settings=settings,
            batch_id=batch_id,
            engine_ids=[f"{spec.deployment}-{batch_id}-{i}" for i in range(missing)],
        )
        self._launching.update(batch.engine_ids)
        try:
            started = await self._in_thread(self._launch, batch, time.monotonic() + deadline_s)
        except BaseException:
            batch.abandoned = True  # a launch still running in its thread discards what it starts
            await asyncio.shield(self._in_thread(self._discard, batch))
            raise
        finally:
            self._launching.difference_update(batch.engine_ids)
        return chosen + started

    async def release(self, spec: LaunchSpec, engines: Sequence[EngineHandle]) -> list[str]:
        if not engines:
            return []
        settings = await self._in_thread(self.settings_for, spec.deployment)
        return await self._in_thread(self._release, spec.deployment, settings, [e.engine_id for e in engines])

    async def shutdown(self) -> None:
        """Disconnect this coordinator's driver. The engines keep running on purpose (detached actors):
        the next coordinator finds them by name, as it finds local agents by their pid file."""
        if self._address is not None:
            import ray

            await self._in_thread(ray.shutdown)
            self._address = None
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- settings and the driver ------------------------------------------------------------------

    def settings_for(self, deployment: str) -> RaySettings:
        with Session(self.db) as session:
            row = session.exec(select(Deployment).where(Deployment.name == deployment)).first()
            settings = ray_settings_of(row) if row is not None else None
        if settings is None:
            raise LaunchError(
                f"deployment {deployment} has no Ray settings (launcher is not ray)",
                type_="ray-not-configured",
            )
        return settings

    def connect(self, settings: RaySettings) -> Any:
        """The `ray` module, connected as a driver to the deployment's cluster."""
        try:
            import ray
        except ImportError:
            raise LaunchError(
                "launcher ray needs Ray on the coordinator: pip install 'elastic-ep-control[ray]'",
                type_="ray-not-installed",
            ) from None
        address = settings.address or os.environ.get("RAY_ADDRESS") or "auto"
        with self._connect_lock:
            if self._address is not None and ray.is_initialized():
                if address != self._address:
                    raise LaunchError(
                        f"this coordinator's Ray driver is connected to {self._address}; a coordinator "
                        f"drives one Ray cluster, and this deployment names {address}",
                        type_="ray-cluster-mismatch",
                    )
                return ray
            try:
                ray.init(
                    address=address,
                    namespace=DRIVER_NAMESPACE,
                    log_to_driver=False,  # each agent's log stays with its actor
                    ignore_reinit_error=True,
                )
            except Exception as exc:
                raise LaunchError(
                    f"cannot connect to the Ray cluster at {address}: {one_line(str(exc))}",
                    type_="ray-unreachable",
                ) from None
            self._address = address
            return ray

    # --- launching (worker threads) ---------------------------------------------------------------

    def _launch(self, batch: Batch, give_up: float) -> list[EngineHandle]:
        ray = self.connect(batch.settings)
        try:
            self._stop_orphans(ray, batch.spec.deployment, batch.settings)
        except Exception:  # a sweep that fails must not stop the launch; the next one tries again
            log.exception("ray launcher: looking for orphan engines of %s failed", batch.spec.deployment)
        try:
            return self._start(ray, batch, give_up)
        except LaunchError:
            raise
        except Exception as exc:  # Ray refused a request outright (bad runtime_env, bundle, name...)
            raise LaunchError(
                f"engine {', '.join(batch.engine_ids)} not started: Ray refused: "
                f"{exc.__class__.__name__}: {one_line(str(exc))}",
                batch.engine_ids[0],
                type_="ray-refused",
            ) from None

    def _start(self, ray: Any, batch: Batch, give_up: float) -> list[EngineHandle]:
        group = self._reserve(ray, batch, give_up)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from engine_agent.ray_host import AgentHost

        settings = batch.settings
        actor_class = ray.remote(AgentHost)
        runtime_env = settings.runtime_env.as_ray() if settings.runtime_env else None
        for index, engine_id in enumerate(batch.engine_ids):
            options: dict[str, Any] = {
                "name": engine_id,
                "namespace": settings.namespace,
                "lifetime": "detached",
                "max_restarts": 0,  # a restarted agent would be a stranger to its group: fail visibly
                "max_concurrency": 4,  # describe/stop answer while wait_ready blocks
                "num_cpus": settings.num_cpus,
                "num_gpus": settings.num_gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index
                ),
            }
            if settings.resources:
                options["resources"] = dict(settings.resources)
            if settings.memory_mb:
                options["memory"] = settings.memory_mb * 1024 * 1024
            if runtime_env:
                options["runtime_env"] = runtime_env
            batch.actors[engine_id] = actor_class.options(**options).remote(
                engine_id,
                agent_args(batch.spec, settings),
                token=batch.spec.token,
                # Constructor arguments, not runtime_env (Ray displays that): see engine_agent.ray_host.
                agent_key=batch.spec.agent_key,
                agent_key_previous=batch.spec.agent_key_previous,
                agent_key_previous_until=batch.spec.agent_key_previous_until,
                # What the deployment's runtime_env sets on purpose reaches the agent; nothing else
                # of the node's environment but the allow-list (engine_agent.environment).
                env_names=sorted(settings.runtime_env.env_vars) if settings.runtime_env else [],
                host=settings.agent_host,
            )
        handles = [self._wait_ready(ray, batch, engine_id, give_up) for engine_id in batch.engine_ids]
        if batch.abandoned:
            self._discard(batch)
            raise LaunchError("launch abandoned", type_="cancelled")
        return handles

    def _reserve(self, ray: Any, batch: Batch, give_up: float) -> Any:
        """One placement group for the batch; LaunchError with Ray's view if it cannot be placed."""
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

        settings = batch.settings
        bundle = settings.bundle()
        group = placement_group(
            [dict(bundle) for _ in batch.engine_ids],
            strategy=settings.placement_strategy.value,
            name=batch.group_name,
            lifetime="detached",  # removed with its last engine, not with this driver
        )
        wait_s = max(0.0, min(settings.placement_timeout_s, give_up - time.monotonic()))
        ready, _ = ray.wait([group.ready()], timeout=wait_s)
        if ready:
            return group
        table: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            table = placement_group_table(group)
        with contextlib.suppress(Exception):
            remove_placement_group(group)
        state = (table.get("stats") or {}).get("scheduling_state") or table.get("state") or "PENDING"
        cause = (
            f"Ray could not reserve {len(batch.engine_ids)} x {resources_text(bundle)} "
            f"({settings.placement_strategy.value}) within {wait_s:.1f}s: scheduling state {state}"
            + (" (no node can ever hold one engine's bundle)" if state == "INFEASIBLE" else "")
            + f"; cluster total {resources_text(ray.cluster_resources())}, "
            f"available {resources_text(ray.available_resources())}"
        )
        raise LaunchError(
            f"engine {', '.join(batch.engine_ids)} not started: {cause}",
            batch.engine_ids[0],
            type_="ray-no-resources",
        )

    def _wait_ready(self, ray: Any, batch: Batch, engine_id: str, give_up: float) -> EngineHandle:
        actor = batch.actors[engine_id]
        wait_s = max(0.1, give_up - time.monotonic())
        try:
            info = ray.get(actor.wait_ready.remote(wait_s), timeout=wait_s + 5.0)
        except Exception as exc:
            raise launch_error(ray, engine_id, exc, wait_s, batch.settings.namespace) from None
        return EngineHandle(engine_id=engine_id, url=str(info["url"]))

    def _discard(self, batch: Batch) -> None:
        """Stop every actor the batch started and give its placement group back."""
        with contextlib.suppress(LaunchError):
            ray = self.connect(batch.settings)
            for engine_id in batch.engine_ids:
                self._stop_actor(ray, engine_id, batch.settings.namespace)
            self._remove_group(ray, batch.group_name)

    # --- diagnosis -------------------------------------------------------------------------------

    async def explain(self, spec: LaunchSpec, engine_ids: Sequence[str]) -> dict[str, str]:
        if not engine_ids:
            return {}
        settings = await self._in_thread(self.settings_for, spec.deployment)
        return await self._in_thread(self._explain, settings, list(engine_ids))

    def _explain(self, settings: RaySettings, engine_ids: list[str]) -> dict[str, str]:
        """Ray's word on each engine's actor: alive (and where), or dead and why."""
        ray = self.connect(settings)
        causes: dict[str, str] = {}
        for engine_id in engine_ids:
            causes[engine_id] = actor_story(ray, engine_id, settings.namespace)
        return causes

    # --- releasing and orphans --------------------------------------------------------------------

    def _release(self, deployment: str, settings: RaySettings, engine_ids: Sequence[str]) -> list[str]:
        ray = self.connect(settings)
        gone: list[str] = []
        groups: set[str] = set()
        for engine_id in engine_ids:
            found = self._stop_actor(ray, engine_id, settings.namespace)
            ours = self._batch_of(deployment, engine_id)
            if not found and ours is not None:
                log.warning(
                    "ray launcher: engine %s was already gone: %s",
                    engine_id,
                    actor_story(ray, engine_id, settings.namespace),
                )
            if found or ours is not None:
                gone.append(engine_id)  # stopped now, or our actor already gone (dead, killed)
            if ours is not None:
                groups.add(f"{settings.namespace}/{deployment}-{ours}")
        for group in groups:
            self._remove_group_if_empty(ray, group, deployment, settings.namespace)
        return gone

    def _stop_actor(self, ray: Any, engine_id: str, namespace: str) -> bool:
        """Stop the agent gracefully, then the actor. False if no such actor is alive."""
        try:
            actor = ray.get_actor(engine_id, namespace=namespace)
        except ValueError:
            return False
        with contextlib.suppress(Exception):
            ray.get(actor.stop.remote(self.stop_grace_s), timeout=self.stop_grace_s + 5.0)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        return True

    @staticmethod
    def _batch_of(deployment: str, engine_id: str) -> str | None:
        match = re.fullmatch(re.escape(deployment) + r"-([0-9a-f]{8})-\d+", engine_id)
        return match.group(1) if match else None

    def _remove_group_if_empty(self, ray: Any, group_name: str, deployment: str, namespace: str) -> None:
        from ray.util.placement_group import placement_group_table

        with contextlib.suppress(Exception):
            group = ray.util.get_placement_group(group_name)
            size = len(placement_group_table(group).get("bundles") or {})
            batch_id = group_name.rsplit("-", 1)[-1]
            for index in range(size):
                with contextlib.suppress(ValueError):
                    ray.get_actor(f"{deployment}-{batch_id}-{index}", namespace=namespace)
                    return  # an engine of this group still runs
            ray.util.remove_placement_group(group)

    def _remove_group(self, ray: Any, group_name: str) -> None:
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(ray.util.get_placement_group(group_name))

    def _stop_orphans(self, ray: Any, deployment: str, settings: RaySettings) -> None:
        """Actors of this deployment that the database does not know, or knows as left: started by a
        coordinator that died mid-launch, or released while Ray was unreachable."""
        with Session(self.db) as session:
            row = session.exec(select(Deployment).where(Deployment.name == deployment)).first()
            if row is None:
                return
            known = set(
                session.exec(
                    select(Engine.id).where(
                        Engine.deployment_id == row.id, Engine.state != EngineState.left.value
                    )
                ).all()
            )
        named = ray.util.list_named_actors(all_namespaces=True)
        for entry in named:
            name = str(entry.get("name", ""))
            if entry.get("namespace") != settings.namespace or self._batch_of(deployment, name) is None:
                continue
            if name in known or name in self._launching:
                continue
            log.warning("ray launcher: stopping orphan engine %s (unknown to the coordinator)", name)
            self._stop_actor(ray, name, settings.namespace)
            self._remove_group_if_empty(
                ray,
                f"{settings.namespace}/{deployment}-{self._batch_of(deployment, name)}",
                deployment,
                settings.namespace,
            )
