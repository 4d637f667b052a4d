"""`/v1/webhooks`: outbound subscriptions (changes need admin, reads viewer) and their delivery log.

Only an admin sees a subscription's full URL: for every other role the credentials a URL may carry
(`user:password@`, and the values of its query string) are redacted. A target must be a public address
(`app.core.targets`; `EPCTL_WEBHOOK_ALLOW_NETWORKS` allows more): checked here, and again at every
delivery. The delivery log keeps statuses and short reasons of ours, never a receiver's body."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from sqlmodel import Session

from app.api.deps import DatabaseDep, Reader, SettingsDep, WebhookAdmin
from app.api.params import Offset, TimeText, WebhookIdPath
from app.core.auth import Permission, Principal
from app.core.config import Settings
from app.core.errors import InvalidRequestError
from app.core.problems import problem_responses
from app.core.targets import TargetRefused, check_subscription_target
from app.webhooks import service
from app.webhooks.models import DeliveryState
from app.webhooks.replay import ReplayOutcome, replay

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=problem_responses(401, 403, 422))


def _shown_to(principal: Principal, public: service.WebhookPublic) -> service.WebhookPublic:
    if principal.can(Permission.webhooks):
        return public
    return public.model_copy(update={"url": service.redact_url(public.url)})


async def _check_target(url: str, settings: Settings) -> None:
    try:
        await check_subscription_target(url, settings.webhook_networks)
    except TargetRefused as refused:
        raise InvalidRequestError(str(refused), code="webhook-target-not-allowed") from None


@router.post("", name="create", status_code=status.HTTP_201_CREATED)
async def create_webhook(
    body: service.WebhookCreate, db: DatabaseDep, settings: SettingsDep, _: WebhookAdmin, response: Response
) -> service.WebhookCreated:
    """Subscribe a URL to reconfiguration events. The signing secret (`whsec_...`) is shown here only.
    The URL must reach a public address (422 `webhook-target-not-allowed` otherwise)."""
    await _check_target(body.url, settings)
    created = await db.run(lambda session: service.create_subscription(session, body))
    response.headers["Location"] = f"/v1/webhooks/{created.id}"
    return created


@router.get("", name="list")
async def list_webhooks(db: DatabaseDep, principal: Reader) -> service.WebhookList:
    """Every subscription. URLs are shown in full to admins only (credentials redacted for others)."""
    listed = await db.run(service.list_subscriptions)
    return listed.model_copy(update={"data": [_shown_to(principal, w) for w in listed.data]})


@router.get("/{webhook_id}", name="get", responses=problem_responses(404))
async def get_webhook(webhook_id: WebhookIdPath, db: DatabaseDep, principal: Reader) -> service.WebhookPublic:
    def work(session: Session) -> service.WebhookPublic:
        return service.WebhookPublic.model_validate(service.get_subscription(session, webhook_id))

    return _shown_to(principal, await db.run(work))


@router.patch("/{webhook_id}", name="update", responses=problem_responses(404))
async def update_webhook(
    webhook_id: WebhookIdPath,
    body: service.WebhookUpdate,
    db: DatabaseDep,
    settings: SettingsDep,
    _: WebhookAdmin,
) -> service.WebhookPublic:
    """Change the URL, event types or description; `active: true` re-enables a subscription (its pending
    deliveries then go out). A new URL must reach a public address, as at creation."""
    if body.url is not None:
        await _check_target(body.url, settings)
    return await db.run(lambda session: service.update_subscription(session, webhook_id, body))


@router.post("/{webhook_id}/rotate-secret", name="rotate-secret", responses=problem_responses(404))
async def rotate_webhook_secret(
    webhook_id: WebhookIdPath,
    db: DatabaseDep,
    settings: SettingsDep,
    _: WebhookAdmin,
    overlap_s: Annotated[
        float | None,
        Query(
            ge=0, le=30 * 86400, description="how long the old secret keeps signing too (default: settings)"
        ),
    ] = None,
) -> service.WebhookCreated:
    """A new signing secret, used from the next attempt on; shown in this response only. Until
    `previous_secret_expires_at` (`overlap_s`, default `EPCTL_WEBHOOK_ROTATION_OVERLAP_S`, a day) every
    attempt carries a second signature made with the old secret, so receivers switch without a gap."""
    overlap = settings.webhook_rotation_overlap_s if overlap_s is None else overlap_s
    return await db.run(lambda session: service.rotate_secret(session, webhook_id, overlap_s=overlap))


@router.post(
    "/{webhook_id}/replay",
    name="replay",
    status_code=status.HTTP_202_ACCEPTED,
    responses=problem_responses(404),
)
async def replay_webhook(
    webhook_id: WebhookIdPath,
    db: DatabaseDep,
    _: WebhookAdmin,
    since: Annotated[
        datetime, TimeText, Query(description="replay events created at or after this time (RFC 3339)")
    ],
) -> ReplayOutcome:
    """Send the events created since `since` again, in order, with their original `webhook-id`, payload
    and sequence number (also those a disabled subscription's full backlog did not queue)."""
    if since.tzinfo is None:
        raise InvalidRequestError(
            "since needs a time zone, e.g. 2026-12-01T12:00:00Z", code="since-without-zone"
        )
    return await db.run(lambda session: replay(session, webhook_id, since=since))


@router.delete(
    "/{webhook_id}", name="delete", status_code=status.HTTP_204_NO_CONTENT, responses=problem_responses(404)
)
async def delete_webhook(webhook_id: WebhookIdPath, db: DatabaseDep, _: WebhookAdmin) -> Response:
    await db.run(lambda session: service.delete_subscription(session, webhook_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{webhook_id}/deliveries", name="deliveries", responses=problem_responses(404))
async def list_webhook_deliveries(
    webhook_id: WebhookIdPath,
    db: DatabaseDep,
    _: Reader,
    state: DeliveryState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> service.DeliveryList:
    """The delivery log, newest first: one entry per event, with every attempt (status, error, duration)."""
    return await db.run(
        lambda session: service.list_deliveries(session, webhook_id, state=state, limit=limit, offset=offset)
    )
