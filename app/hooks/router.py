"""`/v1/hooks`: inbound scale requests from autoscalers, and the record of every one of them.

- `POST /v1/hooks/scale`: a generic JSON body (`ScaleRequest`), authenticated by a Standard Webhooks
  signature (per-deployment or global inbound secret) or by a bearer token with role autoscaler/operator.
  202 + `Location` when a job was created, 200 when recorded and ignored (cooldown, active job, ...).
- `POST /v1/hooks/alertmanager`: Prometheus Alertmanager's webhook (version 4), bearer token
  (Alertmanager's `http_config.authorization`). 200 with one result per deployment for any readable,
  authenticated payload, whatever was decided: Alertmanager retries non-2xx answers, and retrying a
  decision changes nothing.

Bad input is 4xx problem+json and creates no job: 401 (missing/bad/stale signature, bad token),
403 (role), 409 (replayed webhook-id), 404 (unknown deployment), 422 (malformed body). Never 5xx.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response, status

from app.api.deps import Reader, SessionDep, SettingsDep
from app.core.auth import Permission, Principal, authorize
from app.core.errors import AuthenticationError, DomainError, InvalidRequestError, NotFoundError
from app.core.problems import problem_responses
from app.hooks import service
from app.hooks.alertmanager import AlertmanagerPayload
from app.hooks.models import HookDecision, HookSource
from app.tokens.models import TokenRole
from app.tokens.service import authenticate
from app.webhooks import signing

router = APIRouter(prefix="/v1/hooks", tags=["hooks"], responses=problem_responses(401, 403, 422))


async def raw_body(request: Request) -> bytes:
    return await request.body()


RawBody = Annotated[bytes, Depends(raw_body)]


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


def _bearer_caller(session: SessionDep, authorization: str, source: HookSource) -> service.Caller:
    scheme, _, secret = authorization.strip().partition(" ")
    unknown = service.Caller(source, requester=None)
    if scheme.lower() != "bearer" or not secret.strip():
        raise service.reject(
            session,
            unknown,
            AuthenticationError("send `Authorization: Bearer <token>`", code="missing-token"),
        )
    token = authenticate(session, secret=secret.strip())
    if token is None:
        raise service.reject(
            session, unknown, AuthenticationError("unknown or revoked token", code="invalid-token")
        )
    caller = service.Caller(source, requester=token.name)
    try:
        authorize(Principal(token_id=token.id, name=token.name, role=TokenRole(token.role)), Permission.scale)
    except DomainError as exc:
        raise service.reject(session, caller, exc) from None
    return caller


def _raise_if_rejected(outcome: service.HookOutcome) -> None:
    if outcome.decision is not HookDecision.rejected:
        return
    error_type = NotFoundError if outcome.code == "unknown-deployment" else InvalidRequestError
    raise error_type(outcome.reason, code=outcome.code, request_id=outcome.request_id)


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
def scale_hook(
    request: Request, body: RawBody, session: SessionDep, settings: SettingsDep, response: Response
) -> service.HookOutcome:
    """A generic scale request: `{deployment, target_dp_size | step, reason}`, signed (Standard Webhooks:
    `webhook-id`, `webhook-timestamp`, `webhook-signature`) or sent with an autoscaler/operator token."""
    authorization = request.headers.get("authorization", "").strip()
    if authorization:
        caller = _bearer_caller(session, authorization, HookSource.generic)
    else:
        try:
            named = service.deployment_named_in(service.parse_json(body))
        except DomainError:
            named = None  # unreadable: only the global secret can vouch for it; 422 comes after
        if not signing.has_signature_headers(request.headers):
            raise service.reject(
                session,
                service.Caller(HookSource.generic, requester=None),
                AuthenticationError(
                    "send a Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature) "
                    "or `Authorization: Bearer <token>`",
                    code="missing-credentials",
                ),
                deployment_name=named,
            )
        caller = service.verify_signature(
            session, settings, headers=request.headers, body=body, deployment_name=named
        )
    try:
        scale_request = service.parse_scale_request(service.parse_json(body))
    except DomainError as exc:
        raise service.reject(session, caller, exc) from None
    outcome = service.decide(
        session,
        caller,
        scale_request.intent(),
        settings=settings,
        details={"body": scale_request.model_dump()},
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
)
def alertmanager_hook(
    request: Request, body: RawBody, session: SessionDep, settings: SettingsDep
) -> service.AlertmanagerOutcome:
    """Prometheus Alertmanager's webhook (version 4). Firing alerts whose labels name a `deployment` and a
    `target_dp_size` (label or annotation), a `step` (+N/-N) or `scale: up|down` scale it; resolved alerts
    and repeats of a notification already acted on (same group key, fingerprints and start times) are
    recorded as ignored. 200 for every readable, authenticated payload."""
    authorization = request.headers.get("authorization", "").strip()
    if not authorization:
        raise service.reject(
            session,
            service.Caller(HookSource.alertmanager, requester=None),
            AuthenticationError(
                "configure Alertmanager's webhook with `http_config.authorization` (an autoscaler token)",
                code="missing-token",
            ),
        )
    caller = _bearer_caller(session, authorization, HookSource.alertmanager)
    try:
        payload = service.parse_alertmanager(service.parse_json(body))
    except DomainError as exc:
        raise service.reject(session, caller, exc) from None
    return service.handle_alertmanager(session, caller, payload, settings=settings)


@router.get("/requests", name="requests")
def list_hook_requests(
    session: SessionDep,
    _: Reader,
    deployment: str | None = None,
    decision: HookDecision | None = None,
    source: HookSource | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> service.HookRequestList:
    """Every inbound request, newest first, with the decision and why."""
    return service.list_requests(
        session, deployment=deployment, decision=decision, source=source, limit=limit, offset=offset
    )
