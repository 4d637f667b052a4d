"""When a loss happened and what clients saw of it, from the evidence there is (pure: no clock, no I/O).

The loss (`loss_moment`), best evidence first:
- `agents`: the survivors' record of when their group last stepped (every member steps together, so its
  clients were served until then). It survives a coordinator's downtime: the agents keep reporting it.
- `heartbeat`: the lost engine's last heartbeat (what the record knows of an engine that went silent);
  after a coordinator's downtime that is the dead coordinator's last one: late evidence, second best.
- `detected`: nothing earlier: when the coordinator found it.

The clients' outage (`client_outage`) runs from its start to the first moment the deployment served
again (the first good canary answer since, or the recovery's new generation serving, whichever came
first). Its start, best evidence first:
- `job-probe`: a job's canaries were running when clients lost service, and still failing when the job
  ended: from their first failure after the last good answer (one loss, measured from outside);
- `agents`: the survivors' record of when their group last served;
- `canaries`: the incident's own canaries failed before they were answered: from the loss as recorded.
Without any of these, nothing saw clients fail and nothing watched when the loss happened (the
incident's canaries were answered from their first): `not-measured`, a null figure, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class LossEvidence(StrEnum):
    agents = "agents"
    heartbeat = "heartbeat"
    detected = "detected"


class OutageSource(StrEnum):
    job_probe = "job-probe"
    agents = "agents"
    canaries = "canaries"
    not_measured = "not-measured"


def loss_moment(
    *, group_last_step_at: datetime | None, heartbeat_at: datetime | None, detected_at: datetime
) -> tuple[datetime, LossEvidence]:
    """When the loss happened, and on what evidence (see the module doc)."""
    if group_last_step_at is not None:
        return min(group_last_step_at, detected_at), LossEvidence.agents
    if heartbeat_at is not None and heartbeat_at <= detected_at:
        return heartbeat_at, LossEvidence.heartbeat
    return detected_at, LossEvidence.detected


def better_loss(current: LossEvidence, candidate: LossEvidence) -> bool:
    """Whether evidence of kind `candidate` replaces a loss recorded on `current` evidence: the agents'
    record replaces any other; a heartbeat replaces only the detection time."""
    rank = {LossEvidence.agents: 0, LossEvidence.heartbeat: 1, LossEvidence.detected: 2}
    return rank[candidate] < rank[current]


@dataclass(frozen=True)
class OutageEvidence:
    loss_at: datetime
    loss_evidence: LossEvidence
    job_probe_since: datetime | None = None  # a job's canaries failing from then until the job ended
    canaries_failed: bool = False  # the incident's own canaries failed before their first answer
    answered_at: datetime | None = None  # the first good canary answer since the loss
    serving_again_at: datetime | None = None  # the recovery's new generation serving


@dataclass(frozen=True)
class ClientOutage:
    ms: float | None  # None: not measured
    started_at: datetime | None
    source: OutageSource


def client_outage(evidence: OutageEvidence) -> ClientOutage | None:
    """What clients saw (see the module doc); None while it is not over (nothing served again yet)."""
    ends = [t for t in (evidence.answered_at, evidence.serving_again_at) if t is not None]
    if not ends:
        return None
    if evidence.job_probe_since is not None:
        start, source = evidence.job_probe_since, OutageSource.job_probe
    elif evidence.loss_evidence is LossEvidence.agents:
        start, source = evidence.loss_at, OutageSource.agents
    elif evidence.canaries_failed:
        start, source = evidence.loss_at, OutageSource.canaries
    else:
        return ClientOutage(None, None, OutageSource.not_measured)
    end = max(min(ends), start)
    return ClientOutage(round((end - start).total_seconds() * 1000.0, 1), start, source)


def hits(
    *,
    ended_s_ago: float,
    succeeded: bool,
    made_this_generation: bool,
    clients_out_at_end: bool,
    window_s: float,
) -> bool:
    """Whether a job that ended `ended_s_ago` is the one an incident hit: one that made the generation
    the incident hits (an engine lost right after it), or one that ended while its clients had no
    answer (the outage it saw goes on into the incident: they share the figure)."""
    if ended_s_ago > window_s:
        return False
    return clients_out_at_end or (succeeded and made_this_generation)


def same_loss(*, resolved_s_ago: float, operator_job_since: bool, window_s: float) -> bool:
    """Whether a deployment degraded again right after its incident resolved continues that incident
    (one loss, one incident): within `window_s` of the resolution, with only self-heal jobs since the
    loss was found (its recovery still going on). An operator's job since starts a new story."""
    return resolved_s_ago <= window_s and not operator_job_since
