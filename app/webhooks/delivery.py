"""The outbound webhook delivery worker: outbox -> per-subscription deliveries -> signed POSTs, with retries.

Two steps, each safe with several coordinators on one database:

1. **Dispatch** (`app.webhooks.dispatch`): outbox event -> one delivery per subscription, numbered per
   deployment (`data.sequence`); disabled subscriptions queue up to a bound.
2. **Attempt**: a due delivery is claimed with a compare-and-set that pushes `next_attempt_at` one lease
   into the future (`... WHERE id = :id AND state = 'pending' AND next_attempt_at <= now`): the lease row
   without an extra column. A worker killed mid-attempt leaves the delivery due again when the lease
   ends, and it is attempted again with the same `webhook-id` (the outbox event id), so a receiver that
   saw the first try dedupes the second. The claim counts the attempt and writes its log row as
   "in flight"; the result fills that row in (a row left in flight is marked abandoned at the next
   claim), so the log keeps every attempt, even one its worker did not survive. With `ordered` (the
   default) only a subscription's oldest pending delivery is claimed: events arrive in order.

Every attempt goes to an address checked just before it (`app.core.targets`: public only, unless the
operator allows networks), pinned for the connection, so a name that resolves inside later is refused
then. Its record keeps the status and a short reason of ours, never the receiver's body (viewers read
the delivery log).

Every attempt is signed with the subscription's secret, and during a rotation's overlap also with the
secret it replaced (two `v1,` entries in `webhook-signature`); the replaced one no longer once its
overlap has ended, even for a delivery claimed before. Retries back off exponentially with jitter
(`app.webhooks.policy`); a `Retry-After` on the response (seconds or an HTTP date) replaces the
backoff. `410 Gone` disables the subscription; that delivery and every later one wait (pending) and go
out, in order, when it is re-enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app import metrics
from app.core.clock import utc_now
from app.core.config import Settings
from app.core.targets import IPAddress, TargetRefused, literal_address, resolve_checked
from app.webhooks import signing
from app.webhooks.dispatch import Dispatcher
from app.webhooks.models import (
    DeliveryState,
    OutboxEvent,
    WebhookDelivery,
    WebhookDeliveryAttempt,
    WebhookSubscription,
)
from app.webhooks.policy import DeliveryPolicy, parse_retry_after
from app.webhooks.service import signing_secrets

log = logging.getLogger(__name__)

USER_AGENT = "epctl-webhooks/1"
_ERROR_LIMIT = 2000
ATTEMPT_IN_FLIGHT = "in flight"
ATTEMPT_ABANDONED = "no result: the coordinator stopped (or its claim lease ran out) during this attempt"


@dataclass(frozen=True)
class ClaimedDelivery:
    delivery_id: str
    event_id: str  # also the webhook-id of every attempt
    event_type: str
    subscription_id: str
    url: str
    secrets: tuple[str, ...]  # the current secret, then one in its rotation overlap
    body: bytes
    attempt: int  # the number of the attempt about to be made (1-based)
    attempt_row_id: int  # its row in the attempt log, written at claim time as "in flight"
    previous_until: datetime | None = None  # when the second secret's overlap ends (it signs no more)


@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    error: str | None
    duration_ms: float
    retry_after_s: float | None

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300

    @property
    def gone(self) -> bool:
        return self.status_code == 410

    @property
    def outcome(self) -> str:
        if self.delivered:
            return "delivered"
        if self.gone:
            return "gone"
        return "failed" if self.status_code is not None else "error"


def encode_payload(payload: dict[str, Any]) -> bytes:
    """The exact bytes sent and signed; stable for every attempt of one event."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode()


class DeliveryWorker:
    def __init__(
        self,
        engine: Engine,
        policy: DeliveryPolicy,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.transport = transport
        self.clock = clock

    def dispatch_outbox(self) -> int:
        """Step 1 (`app.webhooks.dispatch`): the deliveries of every undispatched outbox event."""
        return Dispatcher(self.engine, self.policy, self.clock).dispatch_outbox()

    # -- step 2: attempts ------------------------------------------------------------------------------

    def claim_due(self, limit: int) -> list[ClaimedDelivery]:
        if limit <= 0:
            return []
        now = self.clock()
        next_at = col(WebhookDelivery.next_attempt_at)
        due = sa.or_(next_at.is_(None), next_at <= now)
        conditions = [
            col(WebhookDelivery.state) == DeliveryState.pending.value,
            col(WebhookSubscription.active).is_(True),
            due,
        ]
        if self.policy.ordered:
            conditions.append(sa.not_(_older_pending_exists()))
        with Session(self.engine, expire_on_commit=False) as session:
            candidates = session.exec(
                select(WebhookDelivery.id)
                .join(
                    WebhookSubscription, col(WebhookSubscription.id) == col(WebhookDelivery.subscription_id)
                )
                .where(*conditions)
                .order_by(col(WebhookDelivery.next_attempt_at), col(WebhookDelivery.id))
                .limit(limit)
            ).all()
        claimed: list[ClaimedDelivery] = []
        lease_until = now + timedelta(seconds=self.policy.claim_lease_s)
        for delivery_id in candidates:
            with Session(self.engine, expire_on_commit=False) as session:
                result = session.execute(
                    sa.update(WebhookDelivery)
                    .where(
                        col(WebhookDelivery.id) == delivery_id,
                        col(WebhookDelivery.state) == DeliveryState.pending.value,
                        due,
                    )
                    .values(
                        next_attempt_at=lease_until,
                        attempt_count=col(WebhookDelivery.attempt_count) + 1,
                        updated_at=now,
                    )
                )
                if result.rowcount != 1:  # type: ignore[attr-defined]
                    session.rollback()
                    continue
                # An earlier attempt still "in flight" was cut short (its worker died, or its lease ran out).
                session.execute(
                    sa.update(WebhookDeliveryAttempt)
                    .where(
                        col(WebhookDeliveryAttempt.delivery_id) == delivery_id,
                        col(WebhookDeliveryAttempt.status_code).is_(None),
                        col(WebhookDeliveryAttempt.error) == ATTEMPT_IN_FLIGHT,
                    )
                    .values(error=ATTEMPT_ABANDONED)
                )
                row = session.exec(
                    select(WebhookDelivery, OutboxEvent, WebhookSubscription)
                    .join(OutboxEvent, col(OutboxEvent.id) == col(WebhookDelivery.event_id))
                    .join(
                        WebhookSubscription,
                        col(WebhookSubscription.id) == col(WebhookDelivery.subscription_id),
                    )
                    .where(col(WebhookDelivery.id) == delivery_id)
                ).one()
                attempt_row = WebhookDeliveryAttempt(
                    delivery_id=delivery_id,
                    attempt=row[0].attempt_count,
                    status_code=None,
                    error=ATTEMPT_IN_FLIGHT,
                    duration_ms=0.0,
                    created_at=now,
                )
                session.add(attempt_row)
                session.commit()
                assert attempt_row.id is not None
            delivery, event, subscription = row
            claimed.append(
                ClaimedDelivery(
                    delivery_id=delivery.id,
                    event_id=event.id,
                    event_type=event.type,
                    subscription_id=subscription.id,
                    url=subscription.url,
                    secrets=tuple(signing_secrets(subscription, now)),
                    previous_until=subscription.previous_secret_expires_at,
                    body=encode_payload(event.payload),
                    attempt=delivery.attempt_count,
                    attempt_row_id=attempt_row.id,
                )
            )
        return claimed

    async def attempt(self, client: httpx.AsyncClient, claimed: ClaimedDelivery) -> AttemptResult:
        started = time.perf_counter()
        try:
            addresses = await resolve_checked(claimed.url, self.policy.allow_networks)
        except TargetRefused as refused:
            return AttemptResult(None, f"not sent: {refused}"[:_ERROR_LIMIT], _ms_since(started), None)
        except (socket.gaierror, UnicodeError, ValueError):
            return AttemptResult(
                None, "not sent: the target's host does not resolve", _ms_since(started), None
            )
        secrets = claimed.secrets
        if claimed.previous_until is not None and self.clock() >= claimed.previous_until:
            secrets = secrets[:1]  # the rotated-out secret's overlap ended since the claim
        headers = signing.signature_headers(secrets, claimed.event_id, int(time.time()), claimed.body)
        headers["content-type"] = "application/json"
        headers["user-agent"] = USER_AGENT
        try:
            url, pinned_headers, extensions = pinned(claimed.url, addresses[0])
            response = await client.post(
                url,
                content=claimed.body,
                headers={**headers, **pinned_headers},
                timeout=self.policy.timeout_s,
                extensions=extensions,
            )
        except httpx.TimeoutException:
            error = f"timed out after {self.policy.timeout_s:g} s"
            return AttemptResult(None, error, _ms_since(started), None)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            # InvalidURL: a URL stored before the API checked it (app/core/urls.py); recorded like any
            # failed attempt, so the delivery is retried and given up on instead of erroring every poll.
            return AttemptResult(None, _reason(exc), _ms_since(started), None)
        duration_ms = _ms_since(started)
        if 200 <= response.status_code < 300:
            return AttemptResult(response.status_code, None, duration_ms, None)
        retry_after = parse_retry_after(response.headers.get("retry-after"), self.clock())
        # The status only: the receiver's body is not ours to keep (a viewer reads this record).
        return AttemptResult(response.status_code, f"HTTP {response.status_code}", duration_ms, retry_after)

    def record(self, claimed: ClaimedDelivery, result: AttemptResult) -> None:
        now = self.clock()
        values: dict[str, Any] = {
            "last_status_code": result.status_code,
            "last_error": result.error,
            "updated_at": now,
        }
        disable_subscription = False
        if result.delivered:
            values.update(state=DeliveryState.succeeded.value, delivered_at=now, next_attempt_at=None)
        elif result.gone:
            # The subscription is disabled; this delivery waits to go out first when it is re-enabled.
            disable_subscription = True
            values.update(
                next_attempt_at=now,
                attempt_count=0,
                last_error=f"{result.error}; endpoint gone (410): subscription disabled, this event is "
                "sent again when it is re-enabled"[:_ERROR_LIMIT],
            )
        elif claimed.attempt >= self.policy.max_attempts:
            values.update(
                state=DeliveryState.failed.value,
                next_attempt_at=None,
                last_error=f"{result.error}; gave up after {claimed.attempt} attempts"[:_ERROR_LIMIT],
            )
        else:
            delay = result.retry_after_s
            if delay is None:
                delay = self.policy.backoff_s(claimed.attempt)
            values["next_attempt_at"] = now + timedelta(seconds=delay)
        with Session(self.engine, expire_on_commit=False) as session:
            session.execute(
                sa.update(WebhookDeliveryAttempt)
                .where(col(WebhookDeliveryAttempt.id) == claimed.attempt_row_id)
                .values(status_code=result.status_code, error=result.error, duration_ms=result.duration_ms)
            )
            # Only the holder of the latest attempt moves the delivery on: if our lease ran out and another
            # worker claimed it again, our attempt stays in the log and changes nothing else.
            session.execute(
                sa.update(WebhookDelivery)
                .where(
                    col(WebhookDelivery.id) == claimed.delivery_id,
                    col(WebhookDelivery.attempt_count) == claimed.attempt,
                    col(WebhookDelivery.state) == DeliveryState.pending.value,
                )
                .values(**values)
            )
            if disable_subscription:
                session.execute(
                    sa.update(WebhookSubscription)
                    .where(col(WebhookSubscription.id) == claimed.subscription_id)
                    .values(active=False, updated_at=now)
                )
            session.commit()
        metrics.record_webhook_delivery(result.outcome)

    # -- the loop --------------------------------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport, follow_redirects=False)

    async def run_once(self) -> int:
        """Dispatch, then attempt every due delivery once and wait for them; return attempts made."""
        await asyncio.to_thread(self.dispatch_outbox)
        claimed = await asyncio.to_thread(self.claim_due, self.policy.concurrency)
        async with self._client() as client:
            await asyncio.gather(*(self._attempt_and_record(client, c) for c in claimed))
        return len(claimed)

    async def _attempt_and_record(self, client: httpx.AsyncClient, claimed: ClaimedDelivery) -> None:
        result = await self.attempt(client, claimed)
        await asyncio.to_thread(self.record, claimed, result)

    async def run_forever(self) -> None:
        """Poll until cancelled. Attempts run as tasks, so one slow endpoint does not hold up the rest."""
        in_flight: set[asyncio.Task[None]] = set()
        async with self._client() as client:
            try:
                while True:
                    try:
                        await asyncio.to_thread(self.dispatch_outbox)
                        free = self.policy.concurrency - len(in_flight)
                        for claimed in await asyncio.to_thread(self.claim_due, free):
                            task = asyncio.create_task(self._attempt_and_record(client, claimed))
                            in_flight.add(task)
                            task.add_done_callback(_finished(in_flight))
                    except asyncio.CancelledError:
                        raise
                    except Exception:  # the database may be briefly unreachable: keep going
                        log.exception("webhook delivery worker: poll failed")
                    await asyncio.sleep(self.policy.poll_s)
            finally:
                for task in in_flight:
                    task.cancel()
                await asyncio.gather(*in_flight, return_exceptions=True)


def _older_pending_exists() -> sa.Exists:
    """A pending delivery of the same subscription for an event dispatched earlier (`dispatch_order`,
    then the outbox id for events dispatched before it existed, which count as the oldest)."""
    older = sa.orm.aliased(WebhookDelivery)
    older_event = sa.orm.aliased(OutboxEvent)
    this_event = sa.orm.aliased(OutboxEvent)
    older_order = sa.func.coalesce(col(older_event.dispatch_order), 0)
    this_order = sa.func.coalesce(col(this_event.dispatch_order), 0)
    return sa.exists().where(
        col(older.subscription_id) == col(WebhookDelivery.subscription_id),
        col(older.state) == DeliveryState.pending.value,
        col(older_event.id) == col(older.event_id),
        col(this_event.id) == col(WebhookDelivery.event_id),
        sa.or_(
            older_order < this_order,
            sa.and_(older_order == this_order, col(older.event_id) < col(WebhookDelivery.event_id)),
        ),
    )


def _finished(in_flight: set[asyncio.Task[None]]) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("webhook delivery attempt failed to record", exc_info=task.exception())

    return done


def pinned(url: str, address: IPAddress) -> tuple[httpx.URL, dict[str, str], dict[str, str]]:
    """The request to `url` sent to `address` (checked already): the URL with the address as its host,
    the name in `Host`, and for https the name as the TLS server name (SNI, and the certificate check)."""
    original = httpx.URL(url)
    target = original.copy_with(host=str(address))
    headers = {"host": original.netloc.decode("ascii")}
    named = literal_address(original.host) is None
    extensions = {"sni_hostname": original.host} if original.scheme == "https" and named else {}
    return target, headers, extensions


def _reason(exc: Exception) -> str:
    """A failed attempt in a few words of ours."""
    if isinstance(exc, httpx.ConnectError):
        return "could not connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the receiver broke the HTTP exchange"
    if isinstance(exc, httpx.InvalidURL):
        return "not sent: the URL is not valid"
    return f"failed: {type(exc).__name__}"


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)


@contextlib.asynccontextmanager
async def delivery_worker(engine: Engine, settings: Settings) -> AsyncIterator[DeliveryWorker | None]:
    """Run the worker for the life of the app (a lifespan helper); a no-op when disabled in settings."""
    if not settings.webhook_worker_enabled:
        yield None
        return
    worker = DeliveryWorker(engine, DeliveryPolicy.from_settings(settings))
    task = asyncio.create_task(worker.run_forever(), name="webhook-delivery-worker")
    try:
        yield worker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
