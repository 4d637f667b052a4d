"""What the two HTTP ways to ask for a job share (`POST /v1/reconfigurations`, `PUT
/v1/deployments/{name}/scale`): the Idempotency-Key header, the key as the services take it, and the
answer's headers that point at the job."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Response

from app.core.auth import Principal
from app.core.config import Settings
from app.jobs.idempotency import IdempotencyKey

IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        min_length=1,
        max_length=255,
        pattern=r"^[!-~]+$",
        description="retries with the same key and body return the same job (printable ASCII)",
    ),
]


def idempotency_of(key: str | None, principal: Principal, settings: Settings) -> IdempotencyKey | None:
    """The header's key, unique per token: two callers may use the same key for different jobs."""
    if key is None:
        return None
    return IdempotencyKey(
        key,
        scope=principal.token_id or principal.name,
        in_flight_timeout_s=settings.idempotency_in_flight_timeout_s,
    )


def point_at_job(response: Response, job_id: str | None, *, replayed: bool) -> None:
    """`Location` of the job the request created (if any); `Idempotent-Replayed` when a retry's key
    answered with the job its first request created."""
    if job_id is not None:
        response.headers["Location"] = f"/v1/reconfigurations/{job_id}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
