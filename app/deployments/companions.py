"""What the deployments API shows and does that is not the record's: a deployment's active job and
desired size (shown on it), and its deletion with its job history (`app.jobs`, `app.scale`).

The record floor imports no job (an import-linter contract: jobs are above deployments), so the
coordinator's assembly (`app.main`) puts these on the app and the router gets them through this
dependency, as it gets the backends (`reactions`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlmodel import Session

from app.deployments.models import Deployment, DesiredSize


@dataclass(frozen=True)
class DeploymentCompanions:
    active_job_ids: Callable[[Session, Collection[str]], dict[str, str]]  # deployment id -> its job
    desired: Callable[[Session, Sequence[Deployment]], dict[str, DesiredSize]]  # by deployment id
    delete: Callable[[Session, str], None]  # a deployment (by name or id) and its job history

    def active_job_id(self, session: Session, deployment_id: str) -> str | None:
        return self.active_job_ids(session, [deployment_id]).get(deployment_id)


def get_companions(request: Request) -> DeploymentCompanions:
    companions: DeploymentCompanions = request.app.state.deployment_companions
    return companions


Companions = Annotated[DeploymentCompanions, Depends(get_companions)]
