"""`/v1/webhooks`: outbound subscriptions (changes need admin, reads viewer) and their delivery log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api.deps import Reader, SessionDep, WebhookAdmin
from app.core.problems import problem_responses
from app.webhooks import service
from app.webhooks.models import DeliveryState

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=problem_responses(401, 403, 422))


@router.post("", name="create", status_code=status.HTTP_201_CREATED)
def create_webhook(
    body: service.WebhookCreate, session: SessionDep, _: WebhookAdmin, response: Response
) -> service.WebhookCreated:
    """Subscribe a URL to reconfiguration events. The signing secret (`whsec_...`) is shown here only."""
    created = service.create_subscription(session, body)
    response.headers["Location"] = f"/v1/webhooks/{created.id}"
    return created


@router.get("", name="list")
def list_webhooks(session: SessionDep, _: Reader) -> service.WebhookList:
    return service.list_subscriptions(session)


@router.get("/{webhook_id}", name="get", responses=problem_responses(404))
def get_webhook(webhook_id: str, session: SessionDep, _: Reader) -> service.WebhookPublic:
    return service.WebhookPublic.from_row(service.get_subscription(session, webhook_id))


@router.patch("/{webhook_id}", name="update", responses=problem_responses(404))
def update_webhook(
    webhook_id: str, body: service.WebhookUpdate, session: SessionDep, _: WebhookAdmin
) -> service.WebhookPublic:
    """Change the URL, event types or description; `active: true` re-enables a subscription (its pending
    deliveries then go out)."""
    return service.update_subscription(session, webhook_id, body)


@router.post("/{webhook_id}/rotate-secret", name="rotate-secret", responses=problem_responses(404))
def rotate_webhook_secret(webhook_id: str, session: SessionDep, _: WebhookAdmin) -> service.WebhookCreated:
    """A new signing secret, used from the next attempt on; shown in this response only."""
    return service.rotate_secret(session, webhook_id)


@router.delete(
    "/{webhook_id}", name="delete", status_code=status.HTTP_204_NO_CONTENT, responses=problem_responses(404)
)
def delete_webhook(webhook_id: str, session: SessionDep, _: WebhookAdmin) -> Response:
    service.delete_subscription(session, webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{webhook_id}/deliveries", name="deliveries", responses=problem_responses(404))
def list_webhook_deliveries(
    webhook_id: str,
    session: SessionDep,
    _: Reader,
    state: DeliveryState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> service.DeliveryList:
    """The delivery log, newest first: one entry per event, with every attempt (status, error, duration)."""
    return service.list_deliveries(session, webhook_id, state=state, limit=limit, offset=offset)
