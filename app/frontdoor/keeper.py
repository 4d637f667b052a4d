"""The HAProxy keeper: follows a deployment's rank-set feed (the same reads `GET .../endpoints` serves)
and makes HAProxy's backend say the same through its Runtime API, applying each version once; then
records which version it applied, so a job can wait for the front door before its next step.

A slot (`e1`..`eN`) is an engine's while the feed lists it; `ready` and `draining` engines get their
address and `ready`/`drain`, `out` ones `maint`. Taking traffic away goes first in each exchange,
giving it last. A keeper that starts (a coordinator restart) takes over the slots already pointing at
listed engines, so HAProxy keeps serving through the restart: it never needs the coordinator to serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from app.api.database import Database
from app.core import changes
from app.core.errors import NotFoundError
from app.deployments.engines.models import Engine
from app.deployments.models import Deployment
from app.frontdoor import service
from app.frontdoor.haproxy import (
    HOLD_SERVER,
    PARKED,
    HaproxyError,
    RuntimeApi,
    add_server_command,
    frontend_name,
    host_port,
    next_slot_name,
)
from app.frontdoor.models import EndpointPublic, EndpointSetPublic, EndpointSetVersion
from app.frontdoor.requestlog import RequestLog, held_in_window
from app.frontdoor.rules import EndpointState
from app.frontdoor.settings import FrontDoorSpec
from app.frontdoor.wakeup import FEED_APPLIED, FEED_CHANGED, PUBLISHING
from app.jobs.models import ReconfigurationJob

log = logging.getLogger(__name__)


class HaproxyKeeper:
    def __init__(self, database: Database, spec: FrontDoorSpec, api: RuntimeApi | None = None) -> None:
        self.database = database
        self.spec = spec
        self.api = api or RuntimeApi(spec.socket)
        self.backend = spec.backend_name
        self.slots: dict[str, str] = {}  # engine id -> slot name
        self.addresses: dict[str, tuple[str, int]] = {}  # slot -> where it points
        self.slot_names: list[str] = []
        self.applied: int | None = None
        self.stale: set[str] = set()  # slots found serving no listed engine: put in maint
        self.requests = RequestLog(spec.request_log) if spec.request_log else None
        self.in_sync = False  # HAProxy's slots are known and say what `applied` says
        self._applying = asyncio.Lock()  # one exchange at a time: the loop's, or a job's `offer`
        self._recording: set[asyncio.Task[None]] = set()
        self._warned: set[str] = set()  # engine addresses the slots cannot speak to, said once

    @property
    def description(self) -> str:
        return f"haproxy runtime API {self.spec.socket} backend {self.backend} (coordinator keeper)"

    async def run(self) -> None:
        deployment_id = await self._register()
        KEEPERS[deployment_id] = self
        try:
            if self.requests is not None:
                try:
                    self.requests.open()
                except OSError:  # held requests go unmeasured; the front door is kept all the same
                    log.warning("front door %s: request log not opened", self.spec.deployment, exc_info=True)
                    self.requests = None
            await self._keep(deployment_id)
        finally:
            if self.requests is not None:
                self.requests.close()
            if KEEPERS.get(deployment_id) is self:
                del KEEPERS[deployment_id]

    async def _keep(self, deployment_id: str) -> None:
        failures = 0
        while True:
            try:
                feed = await self.database.run(
                    lambda session: service.current_public(session, ref=self.spec.deployment)
                )
                applied = None
                async with self._applying:
                    if not self.in_sync:
                        await self._take_over(feed)
                    # A newer version a job offered meanwhile stays: versions never go backwards.
                    behind = self.applied is None or feed.resource_version > self.applied
                    if behind or not self.in_sync:
                        await self.apply(feed)
                        self.applied = applied = feed.resource_version  # a job waiting here goes on
                        FEED_APPLIED.ring()
                    self.in_sync, failures = True, 0
                if applied is not None:
                    await self._record_applied(deployment_id, applied)
            except (HaproxyError, OSError) as exc:
                self.in_sync, failures = False, failures + 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "front door %s: %s (%d failures in a row)", self.spec.deployment, exc, failures
                    )
                await asyncio.sleep(min(0.05 * failures, 1.0))
                continue
            except NotFoundError:
                await asyncio.sleep(1.0)
                continue
            except Exception:  # a busy database, a bug: keep keeping (HAProxy serves meanwhile)
                self.in_sync = False
                log.exception("front door %s: keeper pass failed", self.spec.deployment)
                await asyncio.sleep(1.0)
                continue
            await FEED_CHANGED.wait(self.spec.poll_s)

    async def offer(self, deployment_id: str, feed: EndpointSetPublic) -> None:
        """A version a job in this process just wrote: applied now, without waiting for the loop to
        wake and read it back (a job's front-door step is on its critical path). Where the keeper is not
        in step with HAProxy, or already applied it, the loop does as it always does."""
        async with self._applying:
            if not self.in_sync or (self.applied is not None and self.applied >= feed.resource_version):
                return
            try:
                await self.apply(feed)
            except (HaproxyError, OSError):
                self.in_sync = False  # the loop takes the slots over again
                log.warning("front door %s: applying an offered version failed", self.spec.deployment)
                return
            self.applied = feed.resource_version
            FEED_APPLIED.ring()
        task = asyncio.create_task(self._record_applied(deployment_id, feed.resource_version))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record_applied(self, deployment_id: str, version: int) -> None:
        counters = await self.api.counters(self.backend)
        await self.database.run(
            lambda session: service.record_applied(session, deployment_id, version, counters)
        )

    async def _register(self) -> str:
        """The deployment's record names its front door (waits for the deployment to exist)."""
        while True:
            try:
                return await self.database.run(
                    lambda session: service.set_front_door(
                        session, ref=self.spec.deployment, url=self.spec.url, keeper=self.description
                    )
                )
            except NotFoundError:
                await asyncio.sleep(0.2)

    async def _take_over(self, feed: EndpointSetPublic) -> None:
        """The slots as HAProxy has them: a slot serving a listed engine's address stays that engine's."""
        servers = await self.api.servers(self.backend)
        servers.pop(HOLD_SERVER, None)  # HAProxy's own, never an engine's (`haproxy.render_config`)
        self.slot_names = sorted(servers, key=lambda name: (len(name), name))
        by_address = {host_port(e.address): e.engine_id for e in feed.endpoints}
        self.slots.clear()
        self.addresses = {name: (s.host, s.port) for name, s in servers.items()}
        for name, server in servers.items():
            engine_id = by_address.get((server.host, server.port))
            if engine_id is not None and server.state != "maint" and engine_id not in self.slots:
                self.slots[engine_id] = name
            elif server.state != "maint":
                self.stale.add(name)

    def _slot_for(self, engine_id: str, added: list[str]) -> str:
        """The engine's slot; a free one, else a new one (its `add server` appended to `added`): a
        deployment larger than the slots HAProxy was started with grows its backend, no reload."""
        slot = self.slots.get(engine_id)
        if slot is not None:
            return slot
        taken = set(self.slots.values())
        free = next((name for name in self.slot_names if name not in taken), None)
        if free is None:
            free = next_slot_name(self.slot_names)
            added.append(add_server_command(self.backend, free, self.spec.tls_ca_file))
            self.slot_names.append(free)
            self.addresses[free] = PARKED
        self.slots[engine_id] = free
        return free

    async def serve_ahead(self, endpoints: list[EndpointPublic]) -> float | None:
        """A rank set a job is about to write as the feed's next version (`derive_switched`), applied
        now, before the write (a job's commit is on the front door's critical path; the write may wait
        for the database). `applied` stays: the version itself is offered once written (`offer`: the
        same commands again, which change nothing). When (monotonic) HAProxy answered, or None where the
        keeper is not in step with HAProxy (the version is applied as usual then)."""
        async with self._applying:
            if not self.in_sync:
                return None
            try:
                await self._apply(endpoints)
            except (HaproxyError, OSError):
                self.in_sync = False  # the loop takes the slots over again
                log.warning("front door %s: applying a rank set ahead failed", self.spec.deployment)
                return None
            return time.monotonic()

    def _speaks(self, address: str) -> bool:
        """Whether the slots speak the engine's protocol: TLS verified against the deployment's CA to an
        `https://` engine where the door was given that CA (`haproxy.slot_options`), plain HTTP to an
        `http://` one where it was not. An engine the door cannot reach as it serves is kept out."""
        https = address.startswith("https://")
        if https == (self.spec.tls_ca_file is not None):
            return True
        if address not in self._warned:
            self._warned.add(address)
            log.warning(
                "front door %s: engine %s kept out: the front door speaks %s to engines%s",
                self.spec.deployment,
                address,
                "TLS" if self.spec.tls_ca_file else "plain HTTP",
                "" if https else " (configure it with the CA that signed the engines' certificates)",
            )
        return False

    async def apply(self, feed: EndpointSetPublic) -> None:
        await self._apply(feed.endpoints)

    async def _apply(self, endpoints: list[EndpointPublic]) -> None:
        """One exchange: drains and removals first, then new addresses and readies."""
        listed = {e.engine_id for e in endpoints}
        away: list[str] = []
        added: list[str] = []
        towards: list[str] = []
        away += [f"set server {self.backend}/{slot} state maint" for slot in sorted(self.stale)]
        self.stale.clear()
        for engine_id in [e for e in self.slots if e not in listed]:
            away.append(f"set server {self.backend}/{self.slots.pop(engine_id)} state maint")
        for endpoint in endpoints:
            if endpoint.state == EndpointState.out or not self._speaks(endpoint.address):
                slot = self.slots.get(endpoint.engine_id)
                if slot is not None:
                    away.append(f"set server {self.backend}/{slot} state maint")
                continue
            slot = self._slot_for(endpoint.engine_id, added)
            if endpoint.state == EndpointState.draining:
                away.append(f"set server {self.backend}/{slot} state drain")
                continue
            host, port = host_port(endpoint.address)
            if self.addresses.get(slot) != (host, port):
                towards.append(f"set server {self.backend}/{slot} addr {host} port {port}")
                self.addresses[slot] = (host, port)
            towards.append(f"set server {self.backend}/{slot} state ready")
        await self.api.run(away + added + towards)


PUBLISH_EVERY_S = 0.25
# What a feed derives from: the engines, their deployment, its active job; and the versions written.
FEED_TABLES = (
    Engine.__tablename__,
    Deployment.__tablename__,
    ReconfigurationJob.__tablename__,
    EndpointSetVersion.__tablename__,
)


async def publish_feeds(
    database: Database, interval_s: float = PUBLISH_EVERY_S, gate: changes.PassGate | None = None
) -> None:
    """Every deployment's feed brought up to date every `interval_s` where the record moved (heartbeats
    that change an engine's facts, fencing, jobs move the record without telling the feed; `publish_pass`):
    watchers only read versions, so their number costs no derivation."""
    PUBLISHING.running = True
    gate = gate or changes.PassGate(FEED_TABLES)
    memo: service.FeedMemo = {}  # what each deployment's newest version was derived from (this publisher's)
    try:
        while True:
            await publish_pass(database, memo, gate)
            await asyncio.sleep(interval_s)
    finally:
        PUBLISHING.running = False


async def publish_pass(database: Database, memo: service.FeedMemo, gate: changes.PassGate) -> bool:
    """One publishing pass, only where the record a feed derives from moved (issue 37: a steady fleet's
    heartbeats move none; `app.core.changes`), or at least every `FULL_PASS_EVERY_S` (another
    coordinator's writes); whether it ran."""
    started = gate.start()
    if started is None:
        return False
    try:
        await database.run(partial(service.refresh_all, memo=memo))
        gate.ran(started)
    except Exception:  # a busy database: the next pass catches up
        log.warning("front door feed: a publishing pass failed", exc_info=True)
    return True


@contextlib.asynccontextmanager
async def front_door_keepers(
    database: Database, specs: list[FrontDoorSpec], *, publish: bool = True
) -> AsyncIterator[list[HaproxyKeeper]]:
    """One keeper task per front door, and the feeds' publisher, while the coordinator runs."""
    keepers = [HaproxyKeeper(database, spec) for spec in specs]
    tasks = [asyncio.create_task(k.run(), name=f"front-door-{k.spec.deployment}") for k in keepers]
    if publish:
        tasks.append(asyncio.create_task(publish_feeds(database), name="front-door-feeds"))
    try:
        yield keepers
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


# The keepers running in this process, by deployment id: a job run here reads its front door's counters
# through them (`counters_of`); a job run by another coordinator has none (its accounting is null).
KEEPERS: dict[str, HaproxyKeeper] = {}


async def counters_of(deployment_id: str) -> dict[str, Any] | None:
    """HAProxy's counters for the deployment's backend (`backend`) and per listed engine (`engines`),
    or None where no keeper of it runs here or HAProxy does not answer."""
    keeper = KEEPERS.get(deployment_id)
    if keeper is None:
        return None
    try:
        raw = await keeper.api.counters(keeper.backend)
    except (HaproxyError, OSError):
        return None
    by_slot = {slot: engine_id for engine_id, slot in keeper.slots.items()}
    return {
        "backend": raw.get("BACKEND", {}),
        "engines": {by_slot[name]: values for name, values in raw.items() if name in by_slot},
    }


async def senders_of(deployment_id: str) -> dict[str, Any] | None:
    """The deployment's front door's requests by sender so far (`RuntimeApi.senders`), with when they
    were read: `read_at` [before, after] the exchange (epoch seconds; the counts are as of a moment
    between). None where no keeper of it runs here, HAProxy does not answer or keeps no such table."""
    keeper = KEEPERS.get(deployment_id)
    if keeper is None:
        return None
    before = time.time()
    try:
        found = await keeper.api.senders(frontend_name(keeper.spec.deployment))
    except (HaproxyError, OSError):
        return None
    return {"read_at": [before, time.time()], "senders": found} if found else None


def held_of(deployment_id: str, start: float | None, end: float | None) -> dict[str, Any] | None:
    """Requests held by a window [start, end] at the deployment's front door (`held_in_window`), or
    None where no keeper here reads its request log."""
    keeper = KEEPERS.get(deployment_id)
    if keeper is None or keeper.requests is None:
        return None
    return held_in_window(list(keeper.requests.recent), keeper.backend, start, end)


def by_sender(start: dict[str, Any] | None, end: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's requests at the front door by who sent them (`senders_of` at its start and its end):
    `clients` (every request without our canaries' header) and `canaries`, each `requests` (counted as
    the front door received them) and `failed` (HAProxy's `http_fail_cnt`), between `counted_from` and
    `counted_until` (each the [before, after] of its read: a request that arrived inside either pair is
    counted or not, nobody can say which). None where either read is missing."""
    if start is None or end is None:
        return None

    def grew(sender: str, counter: str) -> int:
        before = start["senders"].get(sender, {}).get(counter, 0)
        return max(0, end["senders"].get(sender, {}).get(counter, 0) - before)

    counted = {
        plural: {"requests": grew(sender, "http_req_cnt"), "failed": grew(sender, "http_fail_cnt")}
        for sender, plural in (("client", "clients"), ("canary", "canaries"))
    }
    span = {"counted_from": _rounded(start["read_at"]), "counted_until": _rounded(end["read_at"])}
    return {**counted, **span}


def _rounded(moments: list[float]) -> list[float]:
    return [round(moment, 6) for moment in moments]


def accounting(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """A job's requests at the front door: the counters' growth from its start to its end (every
    request its backend passed, our canaries' too: `by_sender` tells them apart)."""

    def grew(before: dict[str, int], after: dict[str, int], key: str) -> int:
        return max(0, after.get(key, 0) - before.get(key, 0))

    b0, b1 = start.get("backend", {}), end.get("backend", {})
    engines = {}
    for engine_id, after in end.get("engines", {}).items():
        before = start.get("engines", {}).get(engine_id, {})
        engines[engine_id] = {"requests": grew(before, after, "stot"), "5xx": grew(before, after, "hrsp_5xx")}
    return {
        "requests": grew(b0, b1, "stot"),
        "answered_2xx": grew(b0, b1, "hrsp_2xx"),
        "failed": {
            "5xx": grew(b0, b1, "hrsp_5xx"),
            "connection": grew(b0, b1, "econ"),
            "response": grew(b0, b1, "eresp"),
        },
        "retried": grew(b0, b1, "wretr"),
        "redispatched": grew(b0, b1, "wredis"),
        "queued_max": b1.get("qmax"),
        "per_engine": engines,
    }
