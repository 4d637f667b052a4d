"""The evidence rules for a loss and the clients' outage it caused (`app.deployments.incidents.outage`),
as tables with a fixed `now` (issue 34: an outage is recorded as clients saw it; a figure nobody
measured is null, never 0; one loss, one incident)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.deployments.incidents.outage import (
    ClientOutage,
    LossEvidence,
    OutageEvidence,
    OutageSource,
    better_loss,
    client_outage,
    hits,
    loss_moment,
    same_loss,
)
from app.probe import CanarySample, probe_figures

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def canaries(start: float, end: float, *, ok: bool, step: float = 0.1) -> list[CanarySample]:
    return [
        CanarySample("a", start + i * step, start + i * step + 0.01, ok, 200 if ok else None)
        for i in range(round((end - start) / step))
    ]


@pytest.mark.parametrize(
    ("samples", "open_since"),
    [
        # Served, then failing to the stop: the job ends with its clients out, since the first canary
        # left without an answer after the last good one.
        (canaries(0.0, 1.0, ok=True) + canaries(1.0, 2.0, ok=False), 1.0),
        # Out, then served again before the stop: over (the job's figure holds it all).
        (canaries(0.0, 1.0, ok=True) + canaries(1.0, 1.5, ok=False) + canaries(1.5, 2.0, ok=True), None),
        # Never answered (a probe that cannot reach the engines): it saw no loss, it saw nothing.
        (canaries(0.0, 2.0, ok=False), None),
    ],
)
def test_a_job_probe_says_when_its_clients_were_still_out_at_its_end(
    samples: list[CanarySample], open_since: float | None
) -> None:
    figures = probe_figures(samples, start=0.0, end=2.0, interval_s=0.1, deadline_s=1.0, epoch_offset=1000.0)
    expected = None if open_since is None else pytest.approx(1000.0 + open_since, abs=0.001)
    assert figures.open_outage_since == expected


def at(seconds: float) -> datetime:
    """`seconds` after NOW (negative: before)."""
    return NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("group_last_step", "heartbeat", "loss", "evidence"),
    [
        # The survivors' record wins, also over an earlier heartbeat (a coordinator that was down: its
        # last stored heartbeat of the lost engine is from before it died, 12.9 s recorded vs 7.5 seen).
        (at(-7.5), at(-12.9), at(-7.5), LossEvidence.agents),
        (None, at(-12.9), at(-12.9), LossEvidence.heartbeat),
        (None, None, NOW, LossEvidence.detected),
        (None, at(+1.0), NOW, LossEvidence.detected),  # a heartbeat "after" the detection: not evidence
        (at(+0.2), None, NOW, LossEvidence.agents),  # an agent's clock a little ahead: never later than found
    ],
)
def test_the_loss_is_when_the_best_evidence_says(
    group_last_step: datetime | None, heartbeat: datetime | None, loss: datetime, evidence: LossEvidence
) -> None:
    assert loss_moment(group_last_step_at=group_last_step, heartbeat_at=heartbeat, detected_at=NOW) == (
        loss,
        evidence,
    )


def test_only_better_evidence_moves_a_recorded_loss() -> None:
    assert better_loss(LossEvidence.heartbeat, LossEvidence.agents)
    assert better_loss(LossEvidence.detected, LossEvidence.heartbeat)
    assert not better_loss(LossEvidence.agents, LossEvidence.heartbeat)


LOSS = at(-10.0)


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        # A job's canaries saw it begin (the job rolled back with its clients out): from their last good
        # answer to the first answer since, even though the incident's canaries never failed (the
        # outage ended before they started: it used to be recorded 0).
        (
            OutageEvidence(LOSS, LossEvidence.heartbeat, job_probe_since=at(-9.0), answered_at=at(-6.5)),
            ClientOutage(2500.0, at(-9.0), OutageSource.job_probe),
        ),
        # The recovery's generation served before any canary answered: that ends it.
        (
            OutageEvidence(
                LOSS,
                LossEvidence.heartbeat,
                job_probe_since=at(-9.0),
                answered_at=at(-6.0),
                serving_again_at=at(-6.7),
            ),
            ClientOutage(2300.0, at(-9.0), OutageSource.job_probe),
        ),
        # The survivors' record of when their group last served.
        (
            OutageEvidence(LOSS, LossEvidence.agents, answered_at=at(-2.0)),
            ClientOutage(8000.0, LOSS, OutageSource.agents),
        ),
        # Only the incident's own canaries: from the loss as recorded (a heartbeat), as they failed.
        (
            OutageEvidence(LOSS, LossEvidence.heartbeat, canaries_failed=True, answered_at=at(-1.0)),
            ClientOutage(9000.0, LOSS, OutageSource.canaries),
        ),
        # Nothing saw clients fail, and nothing watched at the loss: not measured (never 0).
        (
            OutageEvidence(LOSS, LossEvidence.heartbeat, answered_at=at(-1.0)),
            ClientOutage(None, None, OutageSource.not_measured),
        ),
        (
            OutageEvidence(LOSS, LossEvidence.detected, serving_again_at=at(-1.0)),
            ClientOutage(None, None, OutageSource.not_measured),
        ),
        # Not served again yet: not decided.
        (OutageEvidence(LOSS, LossEvidence.agents, canaries_failed=True), None),
        # An answer "before" the start (clocks of two hosts): the outage is 0, not negative.
        (
            OutageEvidence(LOSS, LossEvidence.agents, answered_at=at(-10.5)),
            ClientOutage(0.0, LOSS, OutageSource.agents),
        ),
    ],
)
def test_the_client_outage_counts_from_the_loss_clients_saw(
    evidence: OutageEvidence, expected: ClientOutage | None
) -> None:
    assert client_outage(evidence) == expected


@pytest.mark.parametrize(
    ("ended_s_ago", "succeeded", "made_it", "clients_out", "hit"),
    [
        (10.0, True, True, False, True),  # an engine lost right after the job made this generation
        (10.0, True, False, False, False),  # an older generation's job
        (10.0, False, False, True, True),  # rolled back with its clients out: the outage goes on
        (10.0, False, False, False, False),  # rolled back, clients served throughout
        (61.0, False, False, True, False),  # too long ago
    ],
)
def test_the_job_an_incident_hit(
    ended_s_ago: float, succeeded: bool, made_it: bool, clients_out: bool, hit: bool
) -> None:
    assert (
        hits(
            ended_s_ago=ended_s_ago,
            succeeded=succeeded,
            made_this_generation=made_it,
            clients_out_at_end=clients_out,
            window_s=60.0,
        )
        is hit
    )


@pytest.mark.parametrize(
    ("resolved_s_ago", "operator_job", "same"),
    [(5.0, False, True), (5.0, True, False), (61.0, False, False)],
)
def test_a_relapse_right_after_a_recovery_is_the_same_incident(
    resolved_s_ago: float, operator_job: bool, same: bool
) -> None:
    assert same_loss(resolved_s_ago=resolved_s_ago, operator_job_since=operator_job, window_s=60.0) is same


def held(sent: list[float], answered_at: float) -> list[CanarySample]:
    """Canaries a front door held, answered together at `answered_at`."""
    return [CanarySample("a", t, answered_at, True, 200) for t in sent]


@pytest.mark.parametrize(
    ("samples", "outage_ms", "late"),
    [
        # Four canaries held from 1.0-1.15 (the recorder's most in flight: none sent meanwhile), all
        # answered late at 2.4; the next one, sent only then, at 2.43. Clients had no answer from the
        # first held canary (1.0) to 2.4, not to 2.43 (a late answer is an answer).
        (
            canaries(0.0, 1.0, ok=True) + held([1.0, 1.05, 1.1, 1.15], 2.4) + canaries(2.42, 3.0, ok=True),
            1400.0,
            4,
        ),
        # The same, the held ones answered within the deadline: the same stretch with no answer (the
        # deadline only counts them late or not).
        (
            canaries(0.0, 1.0, ok=True) + held([1.0, 1.05, 1.1, 1.15], 1.9) + canaries(1.92, 3.0, ok=True),
            900.0,
            0,
        ),
        # 503s from 1.0 to 1.5; one canary sent at 1.45 held until 2.6 while the others are answered
        # from 1.51 on: the outage is the 503s' (1.0 to 1.51); the held one is late, not an outage.
        (
            canaries(0.0, 1.0, ok=True)
            + canaries(1.0, 1.5, ok=False)
            + held([1.45], 2.6)
            + canaries(1.5, 3.0, ok=True),
            510.0,
            1,
        ),
        # A late answer inside a stretch of 503s splits it where clients got that answer.
        (
            canaries(0.0, 1.0, ok=True)
            + canaries(1.0, 3.0, ok=False)
            + held([1.0], 2.2)
            + canaries(3.0, 4.0, ok=True),
            1200.0,
            1,
        ),
    ],
)
def test_a_late_answer_ends_the_outage_and_is_counted_late(
    samples: list[CanarySample], outage_ms: float, late: int
) -> None:
    figures = probe_figures(samples, start=0.0, end=4.0, interval_s=0.05, deadline_s=1.0)
    assert figures.outage_ms == pytest.approx(outage_ms, abs=1.0)
    assert figures.late == late
