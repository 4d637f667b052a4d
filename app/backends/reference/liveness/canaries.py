"""What clients saw during an incident, measured from outside: the coordinator's canary probe (a
periodic task of the reference backend, beside the liveness passes).

While an incident of a reference deployment is open (`app.deployments.incidents`), canaries (one token through
`/v1/infer`, as a job's probe sends) go to each engine of the deployment that is not written off or
fenced, every `INTERVAL_S`. The first one answered (or, failing one, the recovery's generation serving:
the incident resolved) ends the clients' outage; where it started is the evidence's call
(`app.deployments.incidents.outage`: a job's canaries that saw it begin, the survivors' record of when
their group last served, or these canaries' failures from the loss), so an outage that ended before
these canaries started is still counted, and one nobody saw is not measured (null), never 0. Engines
that join meanwhile are probed from the next tick on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, col, select

from app.core.clock import utc_now
from app.deployments.agent_keys import agent_keys_of
from app.deployments.engines.models import Engine, EngineState
from app.deployments.incidents import outage
from app.deployments.incidents.models import Incident, IncidentState
from app.deployments.models import Deployment, EngineBackend
from app.jobs import incident_outage
from app.jobs.async_record import WorkerSessions
from app.probe.canary import CanarySample
from app.probe.recorder import CanaryRecorder
from app.probe.reference import ReferenceCanary

log = logging.getLogger(__name__)

INTERVAL_S = 0.1
CANARY_TIMEOUT_S = 1.0
AFTER_RESOLVED_S = 30.0  # a resolved incident is probed this long for its first answer
MAX_PROBE_S = 600.0  # an incident open longer is left without the figure

GONE = (EngineState.left.value, EngineState.fenced.value, EngineState.unreachable.value)


@dataclass
class _Probe:
    recorder: CanaryRecorder
    canary: ReferenceCanary
    started: float


@dataclass(frozen=True)
class _Watch:
    hidden_size: int
    urls: list[str]
    key: str | None
    resolved: bool  # the recovery's generation serves: the outage is over even if no canary answered


def _watched(session: Session) -> dict[str, _Watch]:
    """The incidents of reference deployments whose client outage is not decided yet, by id."""
    recent = utc_now() - timedelta(seconds=AFTER_RESOLVED_S)
    rows = session.exec(
        select(Incident, Deployment)
        .join(Deployment, col(Deployment.id) == col(Incident.deployment_id))
        .where(
            col(Incident.outage_evidence).is_(None),
            col(Deployment.backend) == EngineBackend.reference.value,
            (col(Incident.state) == IncidentState.open.value) | (col(Incident.updated_at) >= recent),
        )
    ).all()
    watched: dict[str, _Watch] = {}
    for incident, deployment in rows:
        urls = session.exec(
            select(Engine.url).where(Engine.deployment_id == deployment.id, col(Engine.state).not_in(GONE))
        ).all()
        hidden = int((deployment.engine_config or {}).get("hidden_size", 64))
        keys = agent_keys_of(deployment)
        resolved = incident.serving_again_at is not None
        watched[incident.id] = _Watch(hidden, list(urls), keys[0] if keys else None, resolved)
    return watched


class IncidentProbes:
    """The canary recorders of the incidents being watched (one runner's), ticked by its loop."""

    def __init__(self, record: WorkerSessions) -> None:
        self.record = record
        self._probes: dict[str, _Probe] = {}

    async def tick(self) -> None:
        watched = await self.record.run_in_session(_watched)
        for incident_id in list(self._probes):
            if incident_id not in watched:
                await self._stop(incident_id)
        for incident_id, watch in watched.items():
            probe = self._probes.get(incident_id)
            if probe is None:
                canary = ReferenceCanary(watch.hidden_size, watch.key)
                recorder = CanaryRecorder(canary, interval_s=INTERVAL_S, timeout_s=CANARY_TIMEOUT_S)
                probe = self._probes[incident_id] = _Probe(recorder, canary, time.monotonic())
                await recorder.start()
            probe.recorder.set_targets(watch.urls)
            answered = next((s for s in probe.recorder.samples if s.ok), None)
            if answered is not None or watch.resolved:
                await self._record(incident_id, probe, answered)
            elif time.monotonic() - probe.started > MAX_PROBE_S:
                log.warning("incident %s: no canary answered in %.0f s", incident_id, MAX_PROBE_S)
                await self._stop(incident_id)

    async def _record(self, incident_id: str, probe: _Probe, answered: CanarySample | None) -> None:
        """Decide the outage on what the canaries saw (the first answer, if one) and the record."""
        until = answered.done_at if answered is not None else float("inf")
        failed_before = any(not s.ok for s in probe.recorder.samples if s.done_at <= until)
        at = _wall(answered.done_at) if answered is not None else None

        def write(session: Session) -> bool:
            incident = session.get(Incident, incident_id)
            if incident is None:
                return True
            evidence = incident_outage.outage_evidence(
                session, incident, answered_at=at, canaries_failed=failed_before
            )
            found = outage.client_outage(evidence)
            if found is None:
                return False
            incident_outage.record_client_outage(session, incident_id, found)
            return True

        if await self.record.run_in_session(write):
            await self._stop(incident_id)

    async def close(self) -> None:
        for incident_id in list(self._probes):
            await self._stop(incident_id)

    async def _stop(self, incident_id: str) -> None:
        probe = self._probes.pop(incident_id)
        await probe.recorder.stop()
        await probe.canary.aclose()


def _wall(monotonic: float) -> datetime:
    return datetime.fromtimestamp(time.time() - time.monotonic() + monotonic, UTC)
