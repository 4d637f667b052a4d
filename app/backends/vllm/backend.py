"""The vLLM backend as the runner and the deployments API see it: a job runs `flow.py` (or, after a
coordinator's death, `recovery.py`); a new deployment's server is observed at once; a deleted one's
server, where the local launcher runs it, is stopped."""

from __future__ import annotations

import anyio.to_thread

from app.backends.base import Backend, BackendContext
from app.backends.vllm import engine_service
from app.backends.vllm.flow import VllmFlow
from app.backends.vllm.launcher import VllmLauncher
from app.backends.vllm.recovery import reconcile_vllm_job
from app.deployments.models import EngineBackend
from app.launchers.base import DeletedDeployment


class VllmBackend(Backend):
    kind = EngineBackend.vllm

    def __init__(self, context: BackendContext, launcher: VllmLauncher | None = None) -> None:
        self.context = context
        self.launcher = launcher  # the local vLLM launcher, where this coordinator runs one

    async def run(self, job_id: str) -> None:
        await VllmFlow(self.context.db, owner=self.context.owner).run(job_id)

    async def reconcile(self, job_id: str) -> None:
        await reconcile_vllm_job(self.context.db, job_id, owner=self.context.owner)

    async def deployment_created(self, name: str) -> None:
        """Its server is asked for its DP size right away (an unreachable one leaves the deployment
        `degraded`, saying why)."""
        await engine_service.observe_new_deployment(self.context.db, name)

    async def deployment_deleted(self, deleted: DeletedDeployment) -> None:
        if self.launcher is not None:
            await anyio.to_thread.run_sync(self.launcher.stop, deleted.name)  # waits for the server to exit
