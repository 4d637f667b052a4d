"""`/v1/hooks`: inbound scale requests from autoscalers, and the record of every one of them.

- `POST /v1/hooks/scale`: a generic JSON body (`ScaleRequest`), authenticated by a Standard Webhooks
  signature (per-deployment or global inbound secret) or by a bearer token with role autoscaler/operator.
  202 + `Location` when a job was created, 200 when the intent is recorded and waits (deferred, held,
  paused: acted on later without a repeat), was withdrawn (`status: resolved`), or is ignored (a
  duplicate of a request already decided, already at its size).
- `POST /v1/hooks/alertmanager`: Prometheus Alertmanager's webhook (version 4), bearer token
  (Alertmanager's `http_config.authorization`). 200 with one result per deployment when every alert
  was usable (accepted, deferred or ignored); 404 (`unknown-deployment`) or 422 (`unusable-labels`)
  problem+json, with every result, when an alert names no known deployment or no usable size:
  Alertmanager logs a 4xx and does not retry it, so the mistake shows where the operator looks.
  The usable alerts of such a payload are still acted on.

Bad input is 4xx problem+json and creates no job: 401 (missing/bad/stale signature, bad token),
403 (role), 409 (a webhook-id reused with another body), 404 (unknown deployment), 422 (malformed body,
unusable labels, too many deployments in one notification). Never 5xx. Requests that fail
authentication are counted, not recorded; every authenticated one is recorded (a duplicate as such,
linked to the decision it repeats). The rules: docs/operations/webhooks-and-autoscalers.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response, status
from sqlmodel import Session

from app.api.deps import AuthGuard, DatabaseDep, Reader, SettingsDep, get_auth_guard
from app.api.params import DeploymentFilterQuery, Offset
from app.core.errors import AuthenticationError, InvalidRequestError, NotFoundError, TooManyRequestsError
from app.core.problems import problem_responses
from app.scale.hooks import intake, service
from app.scale.hooks.alertmanager import AlertmanagerPayload
from app.scale.hooks.models import AlertmanagerOutcome, HookDecision, HookSource
from app.tokens.service import hash_token
from engine_agent.throttle import retry_after_header

T = TypeVar("T")
GuardDep = Annotated[AuthGuard, Depends(get_auth_guard)]

router = APIRouter(prefix="/v1/hooks", tags=["hooks"], responses=problem_responses(401, 403, 422))


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` inlined, to embed in the OpenAPI request body."""
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(definitions[ref.removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def _json_body(model: type[Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline_refs(model.model_json_schema())}},
        }
    }


async def _guarded(request: Request, guard: AuthGuard, db: DatabaseDep, work: Callable[[Session], T]) -> T:
    """A hook's authentication under the coordinator's failure throttle (as every token is, in
    `app.api.deps.get_principal`): a client out of failures is answered 429 before anything is looked
    up, unless the token it sends worked from there before; refusals are summed up in the log."""
    client = request.client.host if request.client else "unknown"
    scheme, _, secret = request.headers.get("authorization", "").strip().partition(" ")
    token = hash_token(secret.strip()).encode() if scheme.lower() == "bearer" and secret.strip() else None
    wait = guard.throttle.retry_after(client, token)
    if wait is not None:
        guard.refusals.refused(client, "throttled", f"POST {request.url.path}")
        refused = TooManyRequestsError(
            "too many calls that failed authentication from this address; retry later",
            code="too-many-failed-attempts",
        )
        refused.retry_after_s = int(retry_after_header(wait))
        raise refused
    try:
        outcome = await db.run(work)
    except AuthenticationError as exc:
        guard.throttle.failed(client)
        guard.refusals.refused(client, f"hook {exc.code}", f"POST {request.url.path}")
        raise
    if token is not None:
        guard.throttle.succeeded(client, token)
    return outcome


def _raise_if_rejected(outcome: service.HookOutcome) -> None:
    if outcome.decision is not HookDecision.rejected:
        return
    error_type = NotFoundError if outcome.code == "unknown-deployment" else InvalidRequestError
    raise error_type(outcome.reason, code=outcome.code, request_id=outcome.request_id)


def _raise_if_any_rejected(outcome: AlertmanagerOutcome) -> None:
    rejected = [r for r in outcome.results if r.decision is HookDecision.rejected]
    if not rejected:
        return
    codes = {r.code for r in rejected}
    unknown = codes == {"unknown-deployment"}
    error_type = NotFoundError if unknown else InvalidRequestError
    code = "too-many-deployments" if "too-many-deployments" in codes else "unusable-labels"
    raise error_type(
        "; ".join(f"{r.deployment or '(no deployment)'}: {r.reason}" for r in rejected)[:2000],
        code="unknown-deployment" if unknown else code,
        results=[r.model_dump(mode="json") for r in outcome.results],
    )


@router.post(
    "/scale",
    name="scale",
    status_code=status.HTTP_202_ACCEPTED,
    openapi_extra=_json_body(service.ScaleRequest),
    responses={
        200: {"model": service.HookOutcome, "description": "recorded and ignored (the reason says why)"},
        **problem_responses(404, 409),
    },
)
async def scale_hook(
    request: Request, db: DatabaseDep, settings: SettingsDep, guard: GuardDep, response: Response
) -> service.HookOutcome:
    """A generic scale request: `{deployment, target_dp_size | step, reason}`, signed (Standard Webhooks:
    `webhook-id`, `webhook-timestamp`, `webhook-signature`) or sent with an autoscaler/operator token."""
    body = await request.body()
    headers = dict(request.headers)
    outcome = await _guarded(
        request,
        guard,
        db,
        lambda session: intake.scale_request(session, settings, headers=headers, body=body),
    )
    _raise_if_rejected(outcome)
    if outcome.decision is HookDecision.accepted:
        response.headers["Location"] = f"/v1/reconfigurations/{outcome.job_id}"
    else:
        response.status_code = status.HTTP_200_OK
    return outcome


@router.post(
    "/alertmanager",
    name="alertmanager",
    openapi_extra=_json_body(AlertmanagerPayload),
    responses=problem_responses(404),
)
async def alertmanager_hook(
    request: Request, db: DatabaseDep, settings: SettingsDep, guard: GuardDep
) -> AlertmanagerOutcome:
    """Prometheus Alertmanager's webhook (version 4). Firing alerts whose labels name a `deployment` and a
    `target_dp_size` (label or annotation), a `step` (+N/-N) or `scale: up|down` ask to scale it, one
    intent per group and deployment; a repeat of a notification (same group key, deployment, status,
    fingerprints and start times) is a duplicate of its decision; a resolved group withdraws its intent
    if it was not acted on yet. 404/422 problem+json (with every result) when an alert names an unknown
    deployment or carries unusable labels; the usable alerts are still acted on."""
    body = await request.body()
    headers = dict(request.headers)
    outcome = await _guarded(
        request,
        guard,
        db,
        lambda session: intake.alertmanager_request(session, settings, headers=headers, body=body),
    )
    _raise_if_any_rejected(outcome)
    return outcome


@router.get("/requests", name="requests")
async def list_hook_requests(
    db: DatabaseDep,
    _: Reader,
    deployment: DeploymentFilterQuery = None,
    decision: HookDecision | None = None,
    source: HookSource | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> service.HookRequestList:
    """Every recorded inbound request (authenticated callers only), newest first, with the decision and
    why."""
    return await db.run(
        lambda session: service.list_requests(
            session, deployment=deployment, decision=decision, source=source, limit=limit, offset=offset
        )
    )
