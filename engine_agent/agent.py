"""One agent: the parts put together (store server, engine, executor, cleanup worker, metrics) and its
announcement to the coordinator. The HTTP layer (api.py) only talks to this object."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import torch
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from engine_agent import build_info, moe, step_graphs, tls
from engine_agent.coordinators import CoordinatorSet, next_heartbeat_s, shed_retry_after_s
from engine_agent.engine import ReferenceEngine
from engine_agent.groups import GroupAbandoned, start_store_server
from engine_agent.netif import interface_of
from engine_agent.peer_check import BrokenGroup, DataReach, check_peers, reported_break
from engine_agent.peers import notify_peers
from engine_agent.pids import pid_exists
from engine_agent.protocol import (
    AgentHeartbeat,
    AgentInfo,
    AgentRegistration,
    CleanupRecord,
    DeviceMemory,
    GenerationBroken,
    StoreAddress,
)
from engine_agent.reconfig import CleanupWorker, ExecutorHooks, ReconfigExecutor
from engine_agent.resident import ResidentWeights
from engine_agent.serving import ActiveGeneration, PausedAt
from engine_agent.settings import AgentSettings
from engine_agent.transfer import available_backends, start_standing_agent

log = logging.getLogger(__name__)
SWITCH_INTERVAL_S = 0.0005
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
        tls.use_peer_ca(settings.tls_ca_file)
        self.url = url
        self.keys = settings.agent_keys()  # who may call us, and what we send to peers
        self.pid = os.getpid()
        self.engine_id = settings.resolved_engine_id(self.pid)
        self.config = settings.engine_config()
        self.device = torch.device(settings.device_name())
        torch.set_num_threads(settings.torch_threads)
        # The serving loop, the HTTP event loop and the job's worker share the GIL: at Python's default
        # 5 ms switch interval a step boundary waited up to 70 ms behind a thread busy in Python
        # (benchmarks/step_profile.py), ~6 ms at this one. The process is the agent's alone.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.data_host = settings.data_address()
        use_data_interface(self.data_host)
        self.store = start_store_server(self.data_host, settings.store_timeout_s)
        self.store_address = StoreAddress(host=self.data_host, port=self.store.port)
        # Before the probe: its NIXL agent stays as the engine's standing one, lent to each weight
        # channel, so no channel builds (or destroys) an agent beside the serving loop.
        start_standing_agent(self.device)
        self.transfer_backends = available_backends()
        self._executor: ReconfigExecutor | None = None
        self._stop = threading.Event()
        self._beat_now = threading.Event()  # wakes the heartbeat (the generation broke: say so now)
        self._broken: BrokenGroup | None = None  # the last group that broke under us, and who stalled
        self._broken_last_step_at: float | None = None  # when that group last stepped (its clients served)
        self._early: BrokenGroup | None = None  # a probe made while a serving collective waited long
        self._early_at = 0.0  # when that probe started (monotonic)
        self._last_peers: list[tuple[str, StoreAddress]] = []  # our generation's peers' data addresses
        grouped = moe.grouped_step(settings.grouped_step, self.device)
        graphs = step_graphs.graphs_wanted(settings.cuda_graphs, self.device, grouped)
        self.engine = ReferenceEngine(
            self.config,
            self.device,
            on_paused=self._on_engine_paused,
            on_broken=self._on_broken,
            on_stall=self._on_stall,
            grouped_step=grouped,
            graph_buckets=list(settings.cuda_graph_buckets) if graphs else None,
        )
        self.metrics = AgentMetrics(self.engine)
        self.data_reach = DataReach(settings.heartbeat_s, self._data_peers)
        self.cleanup = CleanupWorker(on_failure=self._on_cleanup_failure)
        self.resident = ResidentWeights()  # the rows of a generation that broke, until the next serves
        self.executor = ReconfigExecutor(
            engine_id=self.engine_id,
            engine=self.engine,
            config=self.config,
            platform=settings.platform,
            device=self.device,
            cleanup=self.cleanup,
            hooks=ExecutorHooks(
                on_pause=self._on_pause,
                on_bytes=self.metrics.bytes_transferred.inc,
                on_unresponsive=self._on_unresponsive,
            ),
            default_pause_lease_s=settings.pause_lease_s,
            data_host=self.data_host,
            resident=self.resident,
        )
        self._executor = self.executor
        self._last_contact = time.monotonic()  # the last heartbeat a coordinator answered
        self._announcer: threading.Thread | None = None
        if settings.parent_pid is not None and settings.orphan_grace_s is not None:
            threading.Thread(target=self._watch_parent, name="parent-watch", daemon=True).start()
        if settings.coordinator:
            self._announcer = threading.Thread(target=self._announce, name="announce", daemon=True)
            self._announcer.start()

    def _on_engine_paused(self, paused: PausedAt) -> None:
        if self._executor is not None:  # None only during construction
            self._executor.on_engine_paused(paused)

    def _data_peers(self) -> list[tuple[str, StoreAddress]]:
        """The other members of the generation we serve, or of the last one we were in."""
        active = self.engine.active
        if active is not None:
            self._last_peers = [
                (engine_id, data)
                for engine_id, data in zip(active.members, active.member_data, strict=False)
                if engine_id != self.engine_id and data is not None
            ]
        return self._last_peers

    def _on_stall(self, active: ActiveGeneration) -> None:
        """A serving collective has waited far longer than a step: tell the coordinator now (the
        heartbeat says how long, `stuck_ms`), probe the other members, and tell it again with whom the
        probe found silent (issue 39: a frozen member is fenced on that evidence, and the coordinator
        tells the survivors to leave, well before the serving deadline); if the group breaks at its
        deadline all the same, who stalled is known at once (`_on_broken`)."""
        probed_at = time.monotonic()

        def found(broken: BrokenGroup) -> None:
            self._early, self._early_at = broken, probed_at
            self._beat_now.set()

        self._beat_now.set()
        check_peers(active.generation, self._others(active), found)

    def _on_unresponsive(self, generation: int, engine_ids: list[str]) -> None:
        """Members of `generation` did not answer inside the commit window: named at once when it
        breaks (the window leaves it rather than resume it: `reconfig.window_peers`)."""
        self._early = BrokenGroup(generation, engine_ids)

    def _others(self, active: ActiveGeneration) -> list[tuple[str, str]]:
        return [
            (engine_id, url)
            for engine_id, url in zip(active.members, active.member_urls, strict=False)
            if engine_id != self.engine_id
        ]

    def _on_broken(self, active: ActiveGeneration, exc: Exception) -> None:
        """The serving generation broke: the coordinator hears it in a heartbeat sent now, and again
        once the other members were probed (`engine_agent.peer_check`: who stalled); unless a peer told
        us, the other members are told to give the group up (`engine_agent.peers`)."""
        early = self._early if self._early and self._early.generation == active.generation else None
        self._broken = early or BrokenGroup(active.generation)  # the early probe's names, if it ran
        self._broken_last_step_at = self.engine.counters.last_step_at
        self.resident.keep(active)  # a self-heal re-forms the group from these rows (`resident`)
        self._beat_now.set()
        others = self._others(active)

        def found(broken: BrokenGroup) -> None:
            self._broken = broken
            self._beat_now.set()

        check_peers(active.generation, others, found)
        if isinstance(exc, GroupAbandoned):
            return
        notice = GenerationBroken(
            generation=active.generation, reason=str(exc)[:2000], reporter=self.engine_id
        )
        notify_peers([url for _, url in others], notice, headers=self.keys.peer_headers())

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
            graph_steps=counters.graph_steps,
            step_ms=self.engine.step_ms(),
            requests_served=counters.requests_served,
            queued_requests=self.engine.queued_requests(),
            expert_load=self.engine.expert_load(),
            layer_expert_load=self.engine.layer_expert_load(),
            free_kv_bytes=self.engine.free_kv_bytes(),
            reconfig=reconfig,
            cleanup=self.cleanup.status(),
            cuda_graphs=step_graphs.summary(active.graphs) if active else None,
            device_memory=self._device_memory(),
            resident=self.resident.rows() if active is None else None,
            spare_bytes=self.resident.spare_bytes() if active is None else 0,
        )

    def _device_memory(self) -> DeviceMemory | None:
        if self.device.type != "cuda":
            return None
        return DeviceMemory(
            allocated_bytes=torch.cuda.memory_allocated(self.device),
            reserved_bytes=torch.cuda.memory_reserved(self.device),
        )

    def heartbeat(self) -> AgentHeartbeat:
        active = self.engine.active
        counters = self.engine.counters
        broken, broken_last_step_at = (
            reported_break(
                self._broken, self._broken_last_step_at, counters.failed_generation, counters.last_step_at
            )
            if active is None
            else (None, None)  # a serving engine's old break is history
        )
        return AgentHeartbeat(
            state=self.engine.state,
            generation=active.generation if active else 0,
            rank=active.rank if active else None,
            world_size=active.world_size if active else 0,
            serving_steps=counters.steps,
            group_error=counters.last_error[:2000] if active is None and counters.last_error else None,
            broken_generation=broken.generation if broken else None,
            unresponsive_peers=broken.unresponsive if broken else [],
            broken_last_step_at=broken_last_step_at,
            group_steps=counters.steps + counters.dummy_steps,
            data_unreachable=self.data_reach.unreachable,
            key_check=self.keys.key_check(),
            **self._stuck(active),
        )

    def _stuck(self, active: ActiveGeneration | None) -> dict[str, object]:
        """The heartbeat's `stuck_*` fields while a serving collective has waited past the slow mark
        (with the names of the probe made during this wait), else none."""
        now = time.monotonic()
        stuck_s = active.group.stuck_s(now) if active is not None else None
        if active is None or stuck_s is None:
            return {}
        early = self._early
        probed = early is not None and early.generation == active.generation
        fresh = probed and self._early_at >= now - stuck_s  # made during this wait, not an earlier one
        return {
            "stuck_generation": active.generation,
            "stuck_ms": round(stuck_s * 1000.0, 1),
            "stuck_unanswered": list(early.unresponsive) if fresh and early is not None else [],
        }

    def _announce(self) -> None:
        """Register with a coordinator, then heartbeat. Every coordinator sharing the database will do:
        the list starts as the launch gave it (`--coordinator`, comma-separated) and follows what each
        heartbeat's answer names; one that does not answer is skipped for the next, however long none
        answers (serving never waits for a coordinator)."""
        coordinators = CoordinatorSet(self.settings.coordinator_urls())
        headers = {"Authorization": f"Bearer {self.settings.token}"} if self.settings.token else {}
        registered = False
        warned = False
        with httpx.Client(timeout=5.0, headers=headers, verify=tls.peer_context()) as client:
            while not self._stop.is_set():
                retry_after: float | None = None  # a saturated coordinator's ask (it shed the heartbeat)
                for base in coordinators.in_order():
                    try:
                        if not registered:
                            client.post(
                                f"{base}/v1/engines", json=self._registration().model_dump(mode="json")
                            ).raise_for_status()
                            registered = True
                            log.info("registered with %s as %s", base, self.engine_id)
                        response = client.post(
                            f"{base}/v1/engines/{self.engine_id}/heartbeat",
                            json=heartbeat_body(self.heartbeat()),
                        )
                        if response.status_code == 404:
                            registered = False  # the coordinators forgot us: register again
                            continue
                        shed = shed_retry_after_s(response.status_code, response.headers.get("retry-after"))
                        if shed is not None:  # heard, not recorded: another may record it
                            retry_after = max(retry_after or 0.0, shed)
                            self._last_contact = time.monotonic()
                            continue
                        response.raise_for_status()
                    except httpx.HTTPError as exc:
                        if not warned:
                            log.warning(
                                "coordinator %s unreachable or refused: %s (trying others)", base, exc
                            )
                            warned = True
                        continue
                    coordinators.answered(base, response.json().get("coordinators") or [])
                    warned = False
                    self._last_contact = time.monotonic()
                    retry_after = None  # recorded: the interval as usual
                    break
                self._beat_now.wait(next_heartbeat_s(self.settings.heartbeat_s, retry_after))
                self._beat_now.clear()

    def _registration(self) -> AgentRegistration:
        beat = self.heartbeat()
        return AgentRegistration(
            engine_id=self.engine_id,
            deployment=self.settings.deployment or "",
            url=self.url,
            platform=self.settings.platform,
            device=str(self.device),
            engine=self.config,
            generation=beat.generation,
            rank=beat.rank,
            pid=self.pid,
            hostname=socket.gethostname(),
            data_host=self.data_host,
        )

    def _watch_parent(self) -> None:
        """Opt-in only (throwaway machines): exit once the launcher is gone and no coordinator has
        answered for `orphan_grace_s`. By default serving never depends on a coordinator. SIGTERM to
        ourselves: the server shuts down as on any stop."""
        parent, grace_s = self.settings.parent_pid, self.settings.orphan_grace_s
        assert parent is not None and grace_s is not None
        started_under_parent = os.getppid() == parent
        orphaned_at: float | None = None
        while not self._stop.wait(0.5):
            if orphaned_at is None:
                if pid_exists(parent) and (not started_under_parent or os.getppid() == parent):
                    continue
                orphaned_at = time.monotonic()
                log.warning("launcher (pid %s) gone; exiting unless a coordinator adopts this engine", parent)
            if not self.settings.coordinator:
                break
            silent_s = time.monotonic() - max(orphaned_at, self._last_contact)
            if silent_s >= grace_s:
                break
        else:
            return
        log.warning("no coordinator adopted this orphaned engine within %.1f s; exiting", grace_s)
        os.kill(os.getpid(), signal.SIGTERM)

    def close(self) -> None:
        self._stop.set()
        self.data_reach.stop()
        self._beat_now.set()
        self.executor.shutdown()
        self.engine.stop()
        self.cleanup.stop()


STUCK_FIELDS = frozenset({"stuck_generation", "stuck_ms", "stuck_unanswered"})


def heartbeat_body(beat: AgentHeartbeat) -> dict[str, object]:
    """The heartbeat as sent: the `stuck_*` fields only while stuck. A coordinator that predates them
    refuses fields it does not know (422): only the heartbeats of those seconds are lost to it, and it
    judges a freeze at the serving deadline, as before."""
    return beat.model_dump(mode="json", exclude=None if beat.stuck_ms is not None else set(STUCK_FIELDS))


def use_data_interface(address: str) -> None:
    """UCX (NIXL's transport) on the data address's interface only, unless the operator chose one: on
    a host with several networks it would otherwise pick any. Loopback needs no choice."""
    if address.startswith("127.") or address in ("localhost", "::1") or "UCX_NET_DEVICES" in os.environ:
        return
    interface = interface_of(address)
    if interface is not None:
        os.environ["UCX_NET_DEVICES"] = interface
        log.info("data address %s: UCX_NET_DEVICES=%s", address, interface)
