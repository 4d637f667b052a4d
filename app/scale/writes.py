"""The one way a Scale write is carried out over HTTP, shared by `/v1/deployments/{name}/scale` and the
Kubernetes paths (`app.scale.kube`): the new Scale is made inside the transaction that applies it (a
PATCH reads the current Scale there), `app.scale.service.put_scale` applies it under its rules, and the
answer points at the job it created."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Response
from sqlmodel import Session

from app.api.database import Database
from app.core.auth import Principal
from app.core.config import Settings
from app.jobs.requests import idempotency_of, point_at_job
from app.scale import service
from app.scale.models import Scale


async def write_scale(
    db: Database,
    *,
    ref: str,
    new_scale: Callable[[Session], Scale],
    principal: Principal,
    settings: Settings,
    idempotency_key: str | None,
    response: Response,
) -> Scale:
    """Apply the Scale `new_scale` makes (from the session, so a patch applies to what it read) and set
    the answer's headers; the stored Scale is returned."""

    def work(session: Session) -> service.ScaleOutcome:
        return service.put_scale(
            session,
            ref=ref,
            scale=new_scale(session),
            requester=principal.name,
            idempotency=idempotency_of(idempotency_key, principal, settings),
        )

    outcome = await db.run(work)
    point_at_job(response, outcome.job.id if outcome.job else None, replayed=outcome.replayed)
    return outcome.scale
