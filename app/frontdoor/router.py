"""`GET /v1/deployments/{name}/endpoints`: the deployment's rank set for any router (viewer token).

Plain: the current set (its `resourceVersion`). Watch (long-poll): `?watch=true&resourceVersion=N`
answers with the first version after N as soon as there is one (every change once, in order, across
coordinator restarts: versions are rows, not memory), or after `timeoutSeconds` with the current set
unchanged (same `resourceVersion`: ask again). A router follows it with a loop:

    rv = 0
    while True:
        s = GET .../endpoints?watch=true&resourceVersion={rv}&timeoutSeconds=30
        apply(s.endpoints)      # ready: send; draining: finish held requests, send nothing new; out: none
        rv = s.resourceVersion
"""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import DatabaseDep, Reader, SettingsDep
from app.api.params import INT64_MAX, DeploymentRefPath
from app.core.problems import problem_responses
from app.frontdoor import service
from app.frontdoor.models import EndpointSetPublic
from app.frontdoor.wakeup import FEED_CHANGED, PUBLISHING

router = APIRouter(prefix="/v1/deployments", tags=["deployments"], responses=problem_responses(401, 403, 422))

WATCH_POLL_S = 0.25  # how often a watch re-reads the record (changes of another coordinator)


@router.get(
    "/{name}/endpoints", name="endpoints", responses=problem_responses(404), response_model_by_alias=True
)
async def get_endpoints(
    name: DeploymentRefPath,
    db: DatabaseDep,
    settings: SettingsDep,
    _: Reader,
    watch: Annotated[
        bool, Query(description="long-poll for the first version after `resourceVersion`")
    ] = False,
    resource_version: Annotated[
        int, Query(alias="resourceVersion", ge=0, le=INT64_MAX, description="the version the caller holds")
    ] = 0,
    timeout_seconds: Annotated[
        float,
        Query(
            alias="timeoutSeconds",
            gt=0,
            le=300,
            description="a watch's longest wait (the coordinator's `endpoints_watch_max_s` caps it); a "
            "`resourceVersion` ahead of the newest is a 422 `resource-version-ahead` at once",
        ),
    ] = 30.0,
) -> EndpointSetPublic:
    """Per engine: id, serving address, `dp_rank`, generation and state (`ready`, `draining`, `out` with
    a reason), with the deployment's generation, the `resourceVersion` and the front door (if any)."""
    if not watch:
        return await db.run(lambda session: service.current_public(session, ref=name))
    give_up = time.monotonic() + min(timeout_seconds, settings.endpoints_watch_max_s)
    while True:
        # Where the publisher runs here, it derives the versions and a watch only reads them.
        found = await db.run(
            partial(
                service.next_public,
                ref=name,
                resource_version=resource_version,
                derive_first=not PUBLISHING.running,
            )
        )
        if found is not None:
            return found
        left = give_up - time.monotonic()
        if left <= 0:
            return await db.run(lambda session: service.current_public(session, ref=name))
        await FEED_CHANGED.wait(min(left, WATCH_POLL_S))
