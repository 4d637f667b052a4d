"""What the engines' side does when a deployment comes or goes, as the deployments API sees it.

The backends (`app.backends.base.Backends`) implement it: a vLLM deployment's server is observed at its
creation; a deleted deployment's engines are stopped by the launcher that started them, and its vLLM
server by the local vLLM launcher; engines that refuse the coordinator's agent key are stopped by the
launcher that started them when the key is rotated (self-healing replaces them); a member's report that its
group broke sets the deployment's status in the heartbeat's own transaction. The coordinator's
lifespan puts them on the app; the router gets them through this dependency, so it needs to know neither
the runner nor any backend.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request
from sqlmodel import Session

from app.launchers.base import DeletedDeployment, EnginesToRestart


class DeploymentReactions(Protocol):
    async def deployment_created(self, name: str, backend: str) -> None: ...

    async def deployment_deleted(self, deleted: DeletedDeployment) -> None: ...

    async def restart_engines(self, restart: EnginesToRestart) -> list[str]:
        """Stop engines that refuse the coordinator's key, by the launcher that started them; the ids of
        those stopped (a static pool's are not: their operator restarts them)."""
        ...

    def group_broke(self, session: Session, deployment_id: str) -> None:
        """A member of the deployment just reported that its group broke (the first heartbeat to say so):
        the deployment's status as its backend judges it, written in the heartbeat's transaction (which
        commits it), so the deployment never reads `ready` with that member out of its group (issue 34)."""
        ...


def get_reactions(request: Request) -> DeploymentReactions:
    reactions: DeploymentReactions = request.app.state.backends
    return reactions


Reactions = Annotated[DeploymentReactions, Depends(get_reactions)]
