from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response, status

from app.api.deps import Canceller, Reader, Scaler, SessionDep, SettingsDep
from app.core.problems import problem_responses
from app.jobs import service
from app.jobs.models import JobDetail, JobList, JobPublic, ReconfigurationCreate, RequestSource
from app.jobs.states import JobState
from app.tokens.models import TokenRole

router = APIRouter(
    prefix="/v1/reconfigurations", tags=["reconfigurations"], responses=problem_responses(401, 403, 422)
)


@router.post("", name="create", status_code=status.HTTP_202_ACCEPTED, responses=problem_responses(404, 409))
def create_reconfiguration(
    body: ReconfigurationCreate,
    session: SessionDep,
    settings: SettingsDep,
    principal: Scaler,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=255, description="retries with the same key and body return the same job"),
    ] = None,
) -> JobPublic:
    """Ask for a new DP size. Answers 202 with the pending job; follow `Location` for its progress."""
    source = body.source or RequestSource.api
    if principal.role is TokenRole.autoscaler:
        source = RequestSource.autoscaler
    if source not in (RequestSource.api, RequestSource.cli, RequestSource.autoscaler):
        source = RequestSource.api
    outcome = service.create_reconfiguration(
        session,
        request=body,
        requested_by=source,
        requester=principal.name,
        idempotency_key=idempotency_key,
        idempotency_scope=principal.token_id,
        idempotency_timeout_s=settings.idempotency_in_flight_timeout_s,
    )
    response.headers["Location"] = f"/v1/reconfigurations/{outcome.job.id}"
    if outcome.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return service.job_public(session, outcome.job)


@router.get("", name="list")
def list_reconfigurations(
    session: SessionDep,
    _: Reader,
    deployment: str | None = None,
    state: JobState | None = None,
    source: RequestSource | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=service.MAX_PAGE_SIZE)] = service.DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
) -> JobList:
    """Newest first, `limit` per page; pass `next_cursor` back as `cursor` for the next page.

    `count` is the number of jobs matching the filters, counted exactly on the first page (no `cursor`).
    Later pages repeat that figure, carried in `next_cursor`, rather than counting again: it is the
    total as of the first page and does not follow jobs created or changing state since. Start again
    without a cursor for a fresh count."""
    return service.list_jobs(
        session,
        deployment=deployment,
        state=state,
        source=source,
        created_after=created_after,
        created_before=created_before,
        limit=limit,
        cursor=cursor,
    )


@router.get("/{job_id}", name="get", responses=problem_responses(404))
def get_reconfiguration(job_id: str, session: SessionDep, _: Reader) -> JobDetail:
    """The job with its phases, per-engine results, downtime, error, cleanup outcome and transition log."""
    return service.job_detail(session, job_id=job_id)


@router.post(
    "/{job_id}/cancel",
    name="cancel",
    responses={
        **problem_responses(404, 409),
        202: {"description": "cancel requested; the job rolls back", "model": JobPublic},
    },
)
def cancel_reconfiguration(
    job_id: str, session: SessionDep, principal: Canceller, response: Response
) -> JobPublic:
    """Pending: cancelled now (200). Preparing or syncing: cancel requested (202); the job rolls back and
    ends `cancelled`. Committing or later: 409."""
    outcome = service.cancel_job(session, job_id=job_id, requester=principal.name)
    if not outcome.immediate:
        response.status_code = status.HTTP_202_ACCEPTED
    return service.job_public(session, outcome.job)
