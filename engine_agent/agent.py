"""One agent: the parts put together (store server, engine, executor, cleanup worker, metrics) and its
announcement to the coordinator. The HTTP layer (api.py) only talks to this object."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import torch
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from engine_agent import build_info, moe
from engine_agent.engine import ReferenceEngine
from engine_agent.groups import GroupAbandoned, start_store_server
from engine_agent.peers import notify_peers
from engine_agent.protocol import (
    AgentHeartbeat,
    AgentInfo,
    AgentRegistration,
    CleanupRecord,
    GenerationBroken,
    StoreAddress,
)
from engine_agent.reconfig import CleanupWorker, ExecutorHooks, ReconfigExecutor
from engine_agent.serving import ActiveGeneration, PausedAt
from engine_agent.settings import AgentSettings
from engine_agent.transfer import available_backends

log = logging.getLogger(__name__)
# `*_created` series double the output and nothing reads them.
disable_created_metrics()


class _EngineCollector(Collector):
    """Counters the serving loop keeps itself (no metric calls inside the hot loop)."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = self._engine.counters
        yield CounterMetricFamily(
            "epctl_agent_serving_steps", "Real (non-dummy) serving steps", value=c.steps
        )
        yield CounterMetricFamily(
            "epctl_agent_dummy_steps", "Lock-step iterations with no tokens", c.dummy_steps
        )
        yield CounterMetricFamily(
            "epctl_agent_requests", "Inference requests served", value=c.requests_served
        )
        yield CounterMetricFamily("epctl_agent_tokens", "Tokens served", value=c.tokens_served)
        yield CounterMetricFamily("epctl_agent_pauses", "Serving-loop pauses at a step boundary", c.pauses)


class AgentMetrics:
    def __init__(self, engine: ReferenceEngine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        build_info.register(self.registry, "agent")  # process_*, python_info, epctl_build_info
        # Base units (Prometheus' convention, `promtool check metrics`): seconds, not milliseconds.
        self.pause_seconds = Histogram(
            "epctl_agent_pause_seconds",
            "Stopped window per reconfiguration (seconds)",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=self.registry,
        )
        self.bytes_transferred = Counter(
            "epctl_agent_transfer_bytes",
            "Expert weight bytes staged for new generations",
            registry=self.registry,
        )
        self.cleanup_failures = Counter(
            "epctl_agent_cleanup_failures", "Background cleanups that failed", registry=self.registry
        )


class Agent:
    def __init__(self, settings: AgentSettings, url: str) -> None:
        self.settings = settings
        self.url = url
        self.pid = os.getpid()
        self.engine_id = settings.resolved_engine_id(self.pid)
        self.config = settings.engine_config()
        self.device = torch.device(settings.device_name())
        torch.set_num_threads(settings.torch_threads)
        self.store = start_store_server(settings.advertised_host(), settings.store_timeout_s)
        self.store_address = StoreAddress(host=settings.advertised_host(), port=self.store.port)
        self.transfer_backends = available_backends()
        self._executor: ReconfigExecutor | None = None
        self._stop = threading.Event()
        self._beat_now = threading.Event()  # wakes the heartbeat (the generation broke: say so now)
        self.engine = ReferenceEngine(
            self.config,
            self.device,
            on_paused=self._on_engine_paused,
            on_broken=self._on_broken,
            grouped_step=moe.grouped_step(settings.grouped_step, self.device),
        )
        self.metrics = AgentMetrics(self.engine)
        self.cleanup = CleanupWorker(on_failure=self._on_cleanup_failure)
        self.executor = ReconfigExecutor(
            engine_id=self.engine_id,
            engine=self.engine,
            config=self.config,
            platform=settings.platform,
            device=self.device,
            cleanup=self.cleanup,
            hooks=ExecutorHooks(on_pause=self._on_pause, on_bytes=self.metrics.bytes_transferred.inc),
            default_pause_lease_s=settings.pause_lease_s,
        )
        self._executor = self.executor
        self._last_contact = time.monotonic()  # the last heartbeat a coordinator answered
        self._announcer: threading.Thread | None = None
        if settings.parent_pid is not None:
            threading.Thread(target=self._watch_parent, name="parent-watch", daemon=True).start()
        if settings.coordinator:
            self._announcer = threading.Thread(target=self._announce, name="announce", daemon=True)
            self._announcer.start()

    def _on_engine_paused(self, paused: PausedAt) -> None:
        if self._executor is not None:  # None only during construction
            self._executor.on_engine_paused(paused)

    def _on_broken(self, active: ActiveGeneration, exc: Exception) -> None:
        """The serving generation broke: the coordinator hears it in a heartbeat sent now, and, unless
        a peer told us, the other members are told to give the group up (`engine_agent.peers`)."""
        self._beat_now.set()
        if isinstance(exc, GroupAbandoned):
            return
        peers = [url for url in active.member_urls if url.rstrip("/") != self.url.rstrip("/")]
        notice = GenerationBroken(
            generation=active.generation, reason=str(exc)[:2000], reporter=self.engine_id
        )
        notify_peers(peers, notice)

    def _on_pause(self, pause_ms: float) -> None:
        if pause_ms > 0:
            self.metrics.pause_seconds.observe(pause_ms / 1000.0)

    def _on_cleanup_failure(self, record: CleanupRecord) -> None:
        self.metrics.cleanup_failures.inc()

    def info(self) -> AgentInfo:
        active = self.engine.active
        counters = self.engine.counters
        reconfig = self.executor.status()
        return AgentInfo(
            engine_id=self.engine_id,
            url=self.url,
            pid=self.pid,
            platform=self.settings.platform,
            device=str(self.device),
            state=self.engine.state,
            generation=active.generation if active else 0,
            rank=active.rank if active else None,
            world_size=active.world_size if active else 0,
            warmup_policy=reconfig.warmup_policy if reconfig else None,
            placement=active.placement if active else [],
            placements=active.placements if active else [],
            engine=self.config,
            store=self.store_address,
            transfer_backends=self.transfer_backends,
            serving_steps=counters.steps,
            step_ms=self.engine.step_ms(),
            requests_served=counters.requests_served,
            queued_requests=self.engine.queued_requests(),
            expert_load=self.engine.expert_load(),
            layer_expert_load=self.engine.layer_expert_load(),
            free_kv_bytes=self.engine.free_kv_bytes(),
            reconfig=reconfig,
            cleanup=self.cleanup.status(),
        )

    def heartbeat(self) -> AgentHeartbeat:
        active = self.engine.active
        counters = self.engine.counters
        return AgentHeartbeat(
            state=self.engine.state,
            generation=active.generation if active else 0,
            rank=active.rank if active else None,
            world_size=active.world_size if active else 0,
            serving_steps=counters.steps,
            group_error=counters.last_error[:2000] if active is None and counters.last_error else None,
        )

    def _announce(self) -> None:
        """Register with the coordinator, then heartbeat; an unreachable coordinator is retried."""
        base = (self.settings.coordinator or "").rstrip("/")
        headers = {"Authorization": f"Bearer {self.settings.token}"} if self.settings.token else {}
        registered = False
        warned = False
        with httpx.Client(timeout=5.0, headers=headers) as client:
            while not self._stop.is_set():
                try:
                    if not registered:
                        registration = AgentRegistration(
                            engine_id=self.engine_id,
                            deployment=self.settings.deployment or "",
                            url=self.url,
                            platform=self.settings.platform,
                            device=str(self.device),
                            engine=self.config,
                            generation=self.heartbeat().generation,
                            rank=self.heartbeat().rank,
                        )
                        client.post(
                            f"{base}/v1/engines", json=registration.model_dump(mode="json")
                        ).raise_for_status()
                        registered = True
                        log.info("registered with %s as %s", base, self.engine_id)
                    else:
                        response = client.post(
                            f"{base}/v1/engines/{self.engine_id}/heartbeat",
                            json=self.heartbeat().model_dump(mode="json"),
                        )
                        if response.status_code == 404:
                            registered = False  # the coordinator forgot us: register again
                        else:
                            response.raise_for_status()
                    warned = False
                    self._last_contact = time.monotonic()
                except httpx.HTTPError as exc:
                    if not warned:
                        log.warning("coordinator %s unreachable or refused: %s (will retry)", base, exc)
                        warned = True
                self._beat_now.wait(self.settings.heartbeat_s)
                self._beat_now.clear()

    def _watch_parent(self) -> None:
        """Exit once the launcher is gone and no coordinator has answered for `orphan_grace_s`: engines
        never outlive a killed coordinator, unless a restarted one (same URL) adopts them by answering
        their heartbeats. SIGTERM to ourselves: the server shuts down as on any stop."""
        parent = self.settings.parent_pid
        assert parent is not None
        started_under_parent = os.getppid() == parent
        orphaned_at: float | None = None
        while not self._stop.wait(0.5):
            if orphaned_at is None:
                if _pid_alive(parent) and (not started_under_parent or os.getppid() == parent):
                    continue
                orphaned_at = time.monotonic()
                log.warning("launcher (pid %s) gone; exiting unless a coordinator adopts this engine", parent)
            if not self.settings.coordinator:
                break
            silent_s = time.monotonic() - max(orphaned_at, self._last_contact)
            if silent_s >= self.settings.orphan_grace_s:
                break
        else:
            return
        log.warning(
            "no coordinator adopted this orphaned engine within %.1f s; exiting", self.settings.orphan_grace_s
        )
        os.kill(os.getpid(), signal.SIGTERM)

    def close(self) -> None:
        self._stop.set()
        self._beat_now.set()
        self.executor.shutdown()
        self.engine.stop()
        self.cleanup.stop()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
