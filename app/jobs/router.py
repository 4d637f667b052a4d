from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from sqlmodel import Session

from app.api.deps import Canceller, DatabaseDep, Reader, Scaler, SettingsDep
from app.api.params import DeploymentFilterQuery, JobIdPath, UtcDateTime
from app.core.problems import problem_responses
from app.jobs import listing, service
from app.jobs.models import JobDetail, JobList, JobPublic, ReconfigurationCreate, RequestSource
from app.jobs.requests import IdempotencyKeyHeader, idempotency_of, point_at_job
from app.jobs.states import JobState
from app.scale import desired
from app.tokens.models import TokenRole

router = APIRouter(
    prefix="/v1/reconfigurations", tags=["reconfigurations"], responses=problem_responses(401, 403, 422)
)


@router.post("", name="create", status_code=status.HTTP_202_ACCEPTED, responses=problem_responses(404, 409))
async def create_reconfiguration(
    body: ReconfigurationCreate,
    db: DatabaseDep,
    settings: SettingsDep,
    principal: Scaler,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> JobPublic:
    """Ask for a new DP size. Answers 202 with the pending job; follow `Location` for its progress. An
    operator's job supersedes every autoscaler intent older than it; an autoscaler token's job is
    refused (409 `autoscaling-paused`) while the deployment's autoscaling is paused."""
    source = body.source or RequestSource.api
    if principal.role is TokenRole.autoscaler:
        source = RequestSource.autoscaler
    if source not in (RequestSource.api, RequestSource.cli, RequestSource.autoscaler):
        source = RequestSource.api

    def work(session: Session) -> tuple[JobPublic, bool]:
        if source is RequestSource.autoscaler:
            desired.refuse_if_paused(session, body.deployment)
        outcome = service.create_reconfiguration(
            session,
            request=body,
            requested_by=source,
            requester=principal.name,
            idempotency=idempotency_of(idempotency_key, principal, settings),
            # An operator's job supersedes every autoscaler intent older than it (in its transaction).
            on_created=None if source is RequestSource.autoscaler else desired.supersede_for_job,
        )
        return service.job_public(session, outcome.job), outcome.replayed

    public, replayed = await db.run(work)
    point_at_job(response, public.id, replayed=replayed)
    return public


@router.get("", name="list", responses=problem_responses(404))
async def list_reconfigurations(
    db: DatabaseDep,
    _: Reader,
    deployment: DeploymentFilterQuery = None,
    state: JobState | None = None,
    source: RequestSource | None = None,
    created_after: UtcDateTime | None = None,
    created_before: UtcDateTime | None = None,
    limit: Annotated[int, Query(ge=1, le=listing.MAX_PAGE_SIZE)] = listing.DEFAULT_PAGE_SIZE,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    count: Annotated[
        listing.CountMode,
        Query(
            description="`capped` (default): exact up to 1,000 matches, else 1,000 with "
            "`count_exact: false`; `exact`: count every match (slower on large histories); `none`: no count"
        ),
    ] = listing.CountMode.capped,
) -> JobList:
    """Newest first, `limit` per page; pass `next_cursor` back as `cursor` for the next page.

    `count` is the number of jobs matching the filters, counted on the first page (no `cursor`) as
    the `count` parameter asks. Later pages repeat that figure, carried in `next_cursor`, rather than
    counting again: it is the total as of the first page and does not follow jobs created or changing
    state since. Start again without a cursor for a fresh count."""
    return await db.run(
        lambda session: listing.list_jobs(
            session,
            deployment=deployment,
            state=state,
            source=source,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
            cursor=cursor,
            count_mode=count,
        )
    )


@router.get("/{job_id}", name="get", responses=problem_responses(404))
async def get_reconfiguration(job_id: JobIdPath, db: DatabaseDep, _: Reader) -> JobDetail:
    """The job with its phases, per-engine results, downtime, error, cleanup outcome and transition log."""
    return await db.run(lambda session: service.job_detail(session, job_id=job_id))


@router.post(
    "/{job_id}/cancel",
    name="cancel",
    responses={
        **problem_responses(404, 409),
        202: {"description": "cancel requested; the job rolls back", "model": JobPublic},
    },
)
async def cancel_reconfiguration(
    job_id: JobIdPath, db: DatabaseDep, principal: Canceller, response: Response
) -> JobPublic:
    """Pending: cancelled now (200). Preparing or syncing: cancel requested (202); the job rolls back and
    ends `cancelled`. Committing or later: 409."""

    def work(session: Session) -> tuple[JobPublic, bool]:
        outcome = service.cancel_job(session, job_id=job_id, requester=principal.name)
        return service.job_public(session, outcome.job), outcome.immediate

    public, immediate = await db.run(work)
    if not immediate:
        response.status_code = status.HTTP_202_ACCEPTED
    return public
