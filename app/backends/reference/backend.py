"""The reference backend: epctl's own agents, driven through the protocol by `flow`, ended after a
coordinator's death by `recovery`, its background cleanup followed by `cleanup`, its engines' liveness
judged by `liveness` (with the incidents' canaries beside it), and a deleted deployment's engines given
back to the launcher that started them."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlmodel import Session

from app.backends.base import Backend, BackendContext, Periodic
from app.backends.reference.cleanup import poll_cleanup_outcomes
from app.backends.reference.flow import Flow
from app.backends.reference.launching import launch_spec
from app.backends.reference.liveness import reported
from app.backends.reference.liveness.canaries import IncidentProbes
from app.backends.reference.liveness.controller import Liveness
from app.backends.reference.liveness.view import Rules
from app.backends.reference.record import JobRecord
from app.backends.reference.recovery import Recovery
from app.backends.reference.spares import SpareKeeper
from app.core.wake import LIVENESS
from app.deployments.models import EngineBackend
from app.launchers.base import DeletedDeployment, EnginesToRestart

log = logging.getLogger(__name__)

INCIDENT_PROBE_INTERVAL_S = 0.5  # how often the incident probes' targets follow the engines
ADOPTION_MARGIN_S = 2.0  # beyond the agent calls' deadline: the adoption's reads and its judge's writes
SPARES_INTERVAL_S = 0.5  # how often the warm spares are counted (launches run in the background)


class ReferenceBackend(Backend):
    kind = EngineBackend.reference

    def __init__(self, context: BackendContext) -> None:
        self.context = context
        self.record = JobRecord(context.db)
        self.flow = Flow(self.record, context.settings, context.launchers, context.owner)
        self.recovery = Recovery(self.record, context.settings, context.launchers)
        timeout = context.heartbeat_timeout_s
        rules = Rules(
            heartbeat_timeout_s=timeout,
            fence_grace_s=timeout,
            health_confirm_s=context.settings.health_confirm_s,
        )
        self.liveness = Liveness(self.record, context.launchers, rules, new_fleet=context.new_fleet)
        self.incident_probes = IncidentProbes(self.record)
        self.spares = SpareKeeper(self.record, context.settings, context.launchers, context.new_fleet)

    async def run(self, job_id: str) -> None:
        async with self.context.new_fleet() as fleet:
            await self.flow.run(job_id, fleet)

    async def reconcile(self, job_id: str) -> None:
        async with self.context.new_fleet() as fleet:
            await self.recovery.reconcile(job_id, fleet)

    async def deployment_deleted(self, deleted: DeletedDeployment) -> None:
        """Stop the engines of a deployment just deleted, through the launcher that started them (a
        static pool keeps its own): they would otherwise run on, registering with a deployment that no
        longer exists. Best effort: the deletion already happened, so a failure is logged."""
        launcher = self.context.launchers.get(deleted.launcher)
        if launcher is None or not deleted.engines:
            return
        spec = launch_spec(self.context.settings, deleted.name, deleted.engine)
        try:
            await launcher.release(spec, deleted.engines)
        except Exception:
            log.exception("deployment %s deleted: stopping its engines failed", deleted.name)

    def group_broke(self, session: Session, deployment_id: str) -> None:
        reported.group_broke(session, deployment_id, self.liveness.rules)

    async def restart_engines(self, restart: EnginesToRestart) -> list[str]:
        """Stop engines that refuse the coordinator's agent key through the launcher that started them
        (a static pool keeps its own: its operator restarts them with the key); self-healing replaces
        those stopped with engines launched with the current key."""
        launcher = self.context.launchers.get(restart.launcher)
        if launcher is None or not restart.engines:
            return []
        spec = launch_spec(self.context.settings, restart.deployment, restart.engine)
        try:
            return await launcher.release(spec, restart.engines)
        except Exception:
            log.exception("deployment %s: stopping engines that refuse its key failed", restart.deployment)
            return []

    def periodic(self) -> Sequence[Periodic]:
        context = self.context
        return [
            Periodic(LIVENESS, context.settings.heartbeat_check_interval_s, self.liveness.tick),
            Periodic("incident-probe", INCIDENT_PROBE_INTERVAL_S, self.incident_probes.tick),
            Periodic("spares", SPARES_INTERVAL_S, self.spares.tick),
            Periodic(
                "cleanup",
                context.settings.cleanup_poll_interval_s,
                lambda: poll_cleanup_outcomes(self.record, context.new_fleet),
            ),
        ]

    async def start(self) -> None:
        """Ask, once, whether the engines the record names still serve (`liveness.adoption`), and wait
        for the verdict, at most one agent call's deadline and a margin for its writes: until it is in,
        the record says `ready` for a deployment whose member may be frozen (issue 34). A verdict that
        takes longer (a database that is slow to answer) is still written when it comes."""
        self.liveness.start_adoption(self.context.new_fleet)
        bound = self.context.agent_timeout_s + ADOPTION_MARGIN_S
        if not await self.liveness.adopted_within(bound):
            log.warning("adoption did not decide within %.1f s; serving the record meanwhile", bound)

    async def stop(self) -> None:
        await self.liveness.stop()
        await self.spares.stop()
        await self.incident_probes.close()
