"""Issue 39: a frozen member fenced on evidence well before the serving deadline, and no member fenced
that is only slow (`app.backends.reference.liveness.engines.frozen_member`, the judge's `frozen` rule,
`judge.freeze_suspects`; the heartbeats' reports in `app.core.stuck`). Pure rows: one view, a fixed `now`.

The deployment: e0, e1, e2 serving generation 1; e2 is the one the others wait on. The evidence of a
freeze: e0 and e1 each report that one of the generation's serving collectives has waited 1 s (past the
slow mark) and that their own probe of e2 got no answer; e2 was last heard 1.5 s ago, before they got
stuck; the coordinator's own probe of e2, started 0.9 s ago, got no answer either. A heartbeat of e2
recorded at least `HEARTBEAT_LATENCY_S` (1 s) after they got stuck proves it ran while they waited.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from app.backends.reference.liveness import verdict as why
from app.backends.reference.liveness.judge import freeze_suspects
from app.backends.reference.liveness.verdict import Fate, Leave, NoJob
from app.backends.reference.liveness.view import DeploymentView, Probed, Reply
from app.core.stuck import Stuck, StuckReports
from app.deployments.engines.fenced import stays_fenced
from tests.runner.liveness_views import NOW, ago, engine, job, verdict, view

STUCK_SINCE = 1.0


def stuck(*unanswered: str, since: float = STUCK_SINCE, gen: int = 1) -> Stuck:
    return Stuck(gen, ago(since), tuple(unanswered), reported_at=ago(0.1))


def frozen_view(**change: Any) -> DeploymentView:
    """The freeze above; `change` replaces one piece of the evidence:
    `e0` / `e1`: that member's stuck report; `e2_heard`: seconds since e2's last heartbeat;
    `probe`: the coordinator's probe of e2; `e2_stuck`: e2's own report; `active`: a job."""
    e0 = engine("e0", rank=0, heard=0.1, stuck=change.get("e0", stuck("e2")), group_steps=100)
    e1 = engine("e1", rank=1, heard=0.1, stuck=change.get("e1", stuck("e2")), group_steps=100)
    e2 = engine(
        "e2",
        rank=2,
        heard=change.get("e2_heard", 1.5),
        stuck=change.get("e2_stuck"),
        probed=change.get("probe", Probed(ago(0.9), Reply.silent)),
        group_steps=99,
    )
    return view([e0, e1, e2], size=3, active=change.get("active"))


def fenced_frozen(seen: DeploymentView) -> bool:
    return verdict(seen).fate("e2") is Fate.frozen


def test_a_member_every_other_waits_on_and_nobody_hears_is_fenced_and_the_others_told_to_leave() -> None:
    found = verdict(frozen_view())
    (fenced,) = found.engines
    assert (fenced.engine_id, fenced.fate, fenced.state, fenced.dp_rank, fenced.release) == (
        "e2", Fate.frozen, "fenced", None, False,
    )  # fmt: skip
    assert found.status is not None and found.status.reason == "engine-stalled"
    assert "e2" in found.status.message and "1.0 s" in found.status.message
    assert found.leave == Leave(1, (("e0", "http://e0"), ("e1", "http://e1")), found.leave.reason)  # type: ignore[union-attr]
    # The survivors still serve the generation: the new one waits until they have left it.
    assert found.action == NoJob(why.WAITING)
    assert found.memory is not None and found.memory.loss_at == ago(1.5) and found.memory.target == 3


@pytest.mark.parametrize(
    "change",
    [
        # Slow, not frozen: its process answers, or its heartbeat runs.
        pytest.param({"probe": Probed(ago(0.9), Reply.answered)}, id="slow-answers-the-coordinator"),
        pytest.param(
            {"e2_heard": 0.5, "e0": stuck("e2", since=2.0), "e1": stuck("e2", since=2.0)},
            id="slow-heartbeats-since-they-got-stuck",
        ),
        pytest.param({"e1": stuck()}, id="slow-answers-a-peer"),
        # Not known yet: the coordinator's probe has not replied, or started before they got stuck.
        pytest.param({"probe": Probed(ago(0.9))}, id="probe-pending"),
        pytest.param({"probe": Probed(ago(1.2), Reply.silent)}, id="probe-older-than-the-wait"),
        pytest.param({"probe": None}, id="not-probed"),
        # Gone (connection refused): the `gone` rule's, not a freeze.
        pytest.param({"probe": Probed(ago(0.9), Reply.gone)}, id="gone"),
        # An overloaded machine: every member waits (a slow step everywhere, or a data link cut).
        pytest.param({"e2_stuck": stuck("e0", "e1")}, id="overloaded-everyone-waits"),
        # Only some wait: no single member every other one waits on.
        pytest.param({"e1": None}, id="only-one-waits"),
        # A report of another generation's collective is no evidence about this one.
        pytest.param({"e1": stuck("e2", gen=7)}, id="stuck-on-another-generation"),
        # A job runs the deployment: the job's deadlines judge it (issue 34's rules).
        pytest.param({"active": job("j1", "preparing", by="operator", ended=1)}, id="a-job-runs"),
    ],
)
def test_no_fence_without_the_whole_evidence(change: dict[str, Any]) -> None:
    found = verdict(frozen_view(**change))
    assert found.fate("e2") is not Fate.frozen and found.leave is None


def test_a_lost_control_link_is_no_freeze() -> None:
    """e2 silent for 20 s to the coordinator while its peers step with it (nobody waits on it): a lost
    control link, as before; never fenced."""
    seen = frozen_view(e0=None, e1=None, e2_heard=20.0, probe=Probed(ago(0.9), Reply.silent))
    assert verdict(seen).fate("e2") is Fate.link_lost
    assert freeze_suspects(seen) == []


@pytest.mark.parametrize(
    ("change", "probed"),
    [
        pytest.param({"probe": None}, ["e2"], id="the-suspect-is-probed"),
        pytest.param({}, [], id="once-per-wait"),
        pytest.param({"probe": Probed(ago(1.2), Reply.answered)}, ["e2"], id="again-for-a-new-wait"),
        pytest.param(
            {"probe": None, "e2_heard": 0.5, "e0": stuck("e2", since=2.0), "e1": stuck("e2", since=2.0)},
            [],
            id="not-when-heard-since",
        ),
        # A heartbeat recorded just after they got stuck may have been sent before the freeze (its
        # handling lagged on a loaded coordinator): no proof of life, the probes decide.
        pytest.param({"probe": None, "e2_heard": 0.5}, ["e2"], id="heard-too-soon-to-count"),
        pytest.param({"probe": None, "e2_stuck": stuck()}, [], id="not-when-it-waits-too"),
        pytest.param(
            {"probe": None, "active": job("j1", "preparing", by="operator", ended=1)}, [], id="not-in-a-job"
        ),
    ],
)
def test_the_coordinator_probes_a_suspect_once_per_wait(change: dict[str, Any], probed: list[str]) -> None:
    assert [e.id for e in freeze_suspects(frozen_view(**change))] == probed


def test_a_two_member_generation_fences_on_the_one_survivor_and_the_coordinator() -> None:
    e0 = engine("e0", rank=0, heard=0.1, stuck=stuck("e1"))
    e1 = engine("e1", rank=1, heard=1.5, probed=Probed(ago(0.9), Reply.silent))
    found = verdict(view([e0, e1], size=2))
    assert found.fate("e1") is Fate.frozen and found.leave is not None
    assert found.leave.engines == (("e0", "http://e0"),)


def test_once_fenced_the_suspect_is_not_judged_again() -> None:
    found = verdict(frozen_view())
    fenced = [replace(e, state="fenced", dp_rank=None) if e.id == "e2" else e for e in frozen_view().engines]
    again = verdict(view(fenced, size=3, status="degraded", reason="engine-stalled"))
    assert found.leave is not None and again.leave is None and again.fate("e2") is None


# --- the heartbeats' reports (`app.core.stuck`) ------------------------------------------------------------


def test_a_report_is_news_once_per_wait_and_per_new_names_and_a_plain_heartbeat_clears_it() -> None:
    reports = StuckReports()
    assert reports.note("e0", 1, 600.0, [], NOW) is True  # a new wait
    assert reports.note("e0", 1, 1050.0, [], NOW + timedelta(seconds=0.5)) is False  # the same wait
    assert reports.snapshot()["e0"].since == NOW - timedelta(milliseconds=600)  # its first start kept
    assert reports.note("e0", 1, 1600.0, ["e2"], NOW + timedelta(seconds=1)) is True  # names: news
    assert reports.note("e0", 1, 600.0, ["e2"], NOW + timedelta(seconds=5)) is True  # a later wait
    assert reports.note("e0", None, None, [], NOW + timedelta(seconds=6)) is False
    assert reports.snapshot() == {}


def test_reports_not_renewed_are_pruned() -> None:
    reports = StuckReports()
    reports.note("e0", 1, 600.0, [], NOW)
    reports.note("e1", 1, 600.0, [], NOW + timedelta(seconds=20))
    reports.prune(NOW + timedelta(seconds=10))
    assert list(reports.snapshot()) == ["e1"]


# --- a fenced engine that thaws on the group its peers left (`app.deployments.engines.fenced`) ------------


@pytest.mark.parametrize(
    ("state", "generation", "deployment_generation", "broken_elsewhere", "stays"),
    [
        ("serving", 4, 5, False, True),  # the deployment re-formed without it
        ("serving", 4, 4, True, True),  # its peers left the group and said so
        ("paused", 4, 5, False, True),
        ("serving", 4, 4, False, False),  # its group still steps (fenced at a coordinator's start): back
        ("idle", 0, 5, True, False),  # it left the old generation: re-admitted by the grow-back
        ("idle", 4, 5, False, False),
    ],
)
def test_a_fenced_engine_reporting_a_group_that_is_gone_stays_fenced(
    state: str, generation: int, deployment_generation: int, broken_elsewhere: bool, stays: bool
) -> None:
    assert stays_fenced(state, generation, deployment_generation, broken_elsewhere) is stays
