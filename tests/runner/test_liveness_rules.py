"""The reference engines' liveness judge (`app.backends.reference.liveness.judge`), pure: one view of a
deployment and a fixed `now` in, one verdict out (each engine's fate, the status and its reason, at most
one self-heal job or why not). One row per rule; the rows that pin a fix of an earlier round name it.
What the writes do with a verdict is shown on a real database in tests/runner/test_selfheal.py and the
files beside it; one real process per boundary in tests/e2e."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.backends.reference.liveness import verdict as why
from app.backends.reference.liveness.judge import REPORTED_BREAK, judge_reported_break, probe_targets
from app.backends.reference.liveness.reach import largest_reachable_set
from app.backends.reference.liveness.verdict import Fate, HealJob, NoJob
from app.backends.reference.liveness.view import Answer, Asked, DeploymentView, EngineSeen, JobSeen
from app.deployments.models import OnEngineLoss
from tests.runner.liveness_views import NOW, RULES, ago, engine, job, members, verdict, view, with_engine

NO_CONFIRM = replace(RULES, health_confirm_s=0.0)


def survivor(name: str = "e0", *, heard: float = 1.0, **kw: Any) -> EngineSeen:
    """A member that left its broken group (idle, on no generation) and heartbeats."""
    return engine(name, "idle", heard=heard, **kw)


# --- silence and what the coordinator hears ---------------------------------------------------------------


def test_a_member_silent_past_the_timeout_is_lost_and_degrades_its_deployment() -> None:
    found = verdict(view([engine("e0", rank=0), engine("e1", rank=1, heard=20)], policy="none"))
    (lost,) = found.engines
    assert (lost.engine_id, lost.fate, lost.state, lost.announce_unreachable, lost.member) == (
        "e1", Fate.lost, "unreachable", True, True,
    )  # fmt: skip
    assert found.status is not None and (found.status.status, found.status.reason) == (
        "degraded", "engine-unreachable",
    )  # fmt: skip
    assert "1 of 2 engines serve generation 1" in found.status.message and "e1" in found.status.message
    assert found.action == NoJob(why.POLICY_NONE)


def test_an_idle_engine_silent_past_the_timeout_is_lost_without_degrading_and_written_off() -> None:
    seen = view([*members(2), engine("spare", "idle", heard=20)], policy="none")
    (lost,) = verdict(seen).engines
    assert (lost.engine_id, lost.fate, lost.member, lost.announce_unreachable) == (
        "spare",
        Fate.lost,
        False,
        True,
    )
    assert verdict(seen).status is None
    healing = verdict(replace(seen, policy=OnEngineLoss.replace))  # silent past the grace: stopped
    assert healing.fate("spare") is Fate.written_off and healing.engines[0].release and healing.status is None


def test_an_engine_heard_within_the_timeout_is_left_alone() -> None:
    found = verdict(view(members(2, heard=14)))
    assert found.engines == () and found.status is None and found.action == NoJob(why.WHOLE)


@pytest.mark.parametrize(
    ("recorded", "shed", "lost"),
    [
        (20, None, True),  # silent, nothing shed: lost
        (20, 3, False),  # its heartbeats were shed by a saturated coordinator 3 s ago: heard, kept
        (20, 16, True),  # shed too long ago: silent past the timeout all the same
        (30, 14, False),  # the shed heartbeat alone keeps it, however old the record
        (1, 40, False),  # a recorded heartbeat newer than the shed one counts
    ],
)
def test_a_heartbeat_shed_by_a_saturated_coordinator_counts_as_heard(
    recorded: float, shed: float | None, lost: bool
) -> None:
    """Issue 37: past saturation the coordinator answers heartbeats 503 at once (`app.core.shedding`);
    its own overload never writes off an engine that heartbeats."""
    shed_at = None if shed is None else ago(shed)
    engines = [engine("e0", rank=0), engine("e1", rank=1, heard=recorded, shed_at=shed_at)]
    found = verdict(view(engines, policy="none"))
    assert (found.fate("e1") is Fate.lost) is lost


def test_heartbeats_shed_count_as_hearing_for_the_deaf_rule() -> None:
    """Every recorded heartbeat is old but the coordinator shed some lately: it hears, it is not deaf."""
    engines = [engine(f"e{i}", rank=i, heard=20, shed_at=ago(2)) for i in range(3)]
    seen = view(engines, size=3, policy="none")
    found = verdict(replace(seen, hearing=replace(seen.hearing, newest_heartbeat_at=ago(2))))
    assert not found.deaf and found.engines == ()


def test_silence_counts_from_when_the_coordinator_started_watching() -> None:
    """Agents could not reach a coordinator that was down: a (re)started one does not count that."""
    seen = view([engine("e0", rank=0), engine("e1", rank=1, heard=60)], watching_since=ago(10), policy="none")
    assert verdict(seen).engines == ()
    assert (
        verdict(replace(seen, hearing=replace(seen.hearing, watching_since=ago(16)))).fate("e1") is Fate.lost
    )


def test_a_coordinator_that_hears_no_engine_at_all_marks_none_lost_every_member_is_a_lost_link() -> None:
    """Every heartbeat stopped together: its own network is cut (issue 24, c0b29aa): fail closed."""
    found = verdict(view(members(3, heard=20), size=3))
    assert found.deaf and {e.engine_id: e.fate for e in found.engines} == dict.fromkeys(
        ["e0", "e1", "e2"], Fate.link_lost
    )
    assert all(e.state == "serving" and e.link_lost_at == ago(20) for e in found.engines)
    assert found.status is None and found.action == NoJob(why.WHOLE)


def test_once_it_hears_again_each_engine_gets_a_full_timeout_from_the_last_deaf_moment() -> None:
    """Heartbeats come back one by one after a cut (48e93cc)."""
    engines = [engine("e0", rank=0, heard=1), engine("e1", rank=1, heard=20), engine("e2", rank=2, heard=20)]
    assert verdict(view(engines, size=3, deaf_at=ago(5), policy="none")).engines == ()
    later = verdict(view(engines, size=3, deaf_at=ago(16), policy="none"))
    assert (later.fate("e1"), later.fate("e2")) == (Fate.lost, Fate.lost)


def test_a_silent_member_whose_group_steps_is_a_lost_control_link_not_a_lost_engine() -> None:
    """Its peers heartbeat, serve the generation with no break and counted past it (c23ddba)."""
    engines = [*members(2, group_steps=500), engine("e2", rank=2, heard=30, group_steps=100)]
    found = verdict(view(engines, size=3))
    (cut,) = found.engines
    assert (cut.engine_id, cut.fate, cut.state, cut.link_lost_at) == (
        "e2",
        Fate.link_lost,
        "serving",
        ago(30),
    )
    assert found.status is None and found.action == NoJob(why.WHOLE)  # ready, nothing heals


@pytest.mark.parametrize(
    "peers",
    [
        pytest.param({"broken_generation": 1, "broken_reported_at": ago(2)}, id="their-group-broke"),
        pytest.param({"group_steps": 100}, id="they-did-not-count-past-it"),
    ],
)
def test_a_silent_member_nobody_vouches_for_is_lost(peers: dict[str, Any]) -> None:
    engines = [*members(2, **peers), engine("e2", rank=2, heard=30, group_steps=100)]
    assert verdict(view(engines, size=3, policy="none")).fate("e2") is Fate.lost


@pytest.mark.parametrize(
    ("state", "active"),
    [
        pytest.param("serving", job("j1", "preparing", by="api", ended=1), id="lost-in-a-job"),
        pytest.param("unreachable", None, id="written-off-after-it"),
    ],
)
def test_a_member_out_of_its_group_is_no_lost_link_any_more(state: str, active: JobSeen | None) -> None:
    """Issue 34: vouched for (a lost link) while its group still counted, then lost once its peers left
    the group it froze: the mark must go with it, or it refuses every job, the self-heal's too (the
    survivors stayed idle, 0 serving, no heal, for as long as the coordinator ran)."""
    frozen = engine("e1", state, rank=1, heard=20, link_lost_at=ago(20))
    seen = view(
        [survivor(broken_generation=1, broken_reported_at=ago(2)), frozen], policy="shrink", active=active
    )
    found = verdict(seen)
    (lost,) = [e for e in found.engines if e.engine_id == "e1"]
    assert lost.state in ("unreachable", "left") and lost.link_lost_at is None, lost
    assert active is not None or (found.job is not None and found.job.target == 1)


def test_a_deployment_a_job_runs_is_the_jobs_to_judge() -> None:
    """Silence is still judged (the engine marked lost, announced); the status and any heal are not."""
    active = job("j1", "preparing", by="api", ended=1)
    found = verdict(view([engine("e0", rank=0), engine("e1", rank=1, heard=20)], active=active))
    assert found.fate("e1") is Fate.lost and found.engines[0].announce_unreachable
    assert found.status is None and isinstance(found.action, NoJob)
    assert found.action.why.startswith(why.JOB_OWNS_IT)


# --- serving during a job ---------------------------------------------------------------------------------

IN_A_JOB = job("j1", "preparing", by="api", ended=1, to_generation=2, to_dp_size=2)  # 3 -> 2


@pytest.mark.parametrize(
    ("engines", "broken_for", "status", "written"),
    [
        pytest.param(members(3), None, "ready", None, id="every-member-serves"),
        pytest.param(
            [engine(f"e{i}", "paused", i) for i in range(3)], None, "ready", None, id="paused-serves"
        ),
        pytest.param(
            [engine("e0", rank=0, gen=2), engine("e1", "paused", 1), engine("e2", "paused", 2)],
            3.0,
            "ready",
            None,
            id="mid-switch-either-generation",
        ),
        pytest.param(  # a shrink's leaver drained at the boundary by design: 2 of min(3, 2) serve
            [engine("e0", "paused", 0), engine("e1", "paused", 1), survivor("e2")],
            3.0,
            "ready",
            None,
            id="the-leaver-drained-at-the-boundary",
        ),
        pytest.param(
            [survivor(), engine("e1", rank=1), survivor("e2")],
            None,
            "ready",
            None,
            id="broken-not-yet-confirmed",
        ),
        pytest.param(
            [survivor(), engine("e1", rank=1), survivor("e2")],
            3.0,
            "ready",
            "1 of 2",
            id="broken-past-confirmation",
        ),
        pytest.param(
            [survivor(), engine("e1", rank=1), survivor("e2")], 3.0, "degraded", None, id="already-degraded"
        ),
        pytest.param(
            [survivor(broken_generation=1, broken_reported_at=ago(1)), engine("e1", rank=1), survivor("e2")],
            None,
            "ready",
            "1 of 2",
            id="a-survivor-reported-its-group-broke",
        ),
    ],
)
def test_during_a_job_the_deployment_is_not_ready_with_fewer_serving_than_it_says(
    engines: list[EngineSeen], broken_for: float | None, status: str, written: str | None
) -> None:
    """Issue 34: a participant frozen in prepare past the serving deadline took its group with it (the
    survivors left it, idle); the record read `ready`, 0 serving, until the job ended. Counted: the
    engines serving (or paused on) the recorded or the job's target generation, against min(recorded,
    target); confirmed as health is."""
    since = None if broken_for is None else ago(broken_for)
    reason = "members-missing" if status == "degraded" else None
    seen = view(engines, size=3, status=status, reason=reason, active=IN_A_JOB, broken_since=since)
    found = verdict(seen)
    if written is None:
        assert found.status is None, found.status
    else:
        assert found.status is not None and (found.status.status, found.status.reason) == (
            "degraded",
            "members-missing",
        )
        assert found.status.message.startswith(written) and "j1" in found.status.message
        assert found.status.hit_job_id == "j1"  # its incident is the job's: it shares the job's outage
    broken = engines[0].state == "idle"  # the survivors left the group
    assert (found.broken_since is not None) == broken, found.broken_since
    assert isinstance(found.action, NoJob) and found.action.why.startswith(why.JOB_OWNS_IT)


# --- a member's report that its group broke, in the heartbeat's own transaction ---------------------------

REPORTER = survivor(broken_generation=1, broken_reported_at=NOW)


@pytest.mark.parametrize(
    ("engines", "size", "status", "active", "written"),
    [
        pytest.param(
            [REPORTER, engine("e1", rank=1)], 2, "ready", None, "1 of 2", id="no-job-degraded-at-once"
        ),
        pytest.param(
            [REPORTER, engine("e1", rank=1), survivor("e2")], 3, "ready", IN_A_JOB, "1 of 2", id="in-a-job"
        ),
        pytest.param(  # the leaver drained at the shrink's boundary: 2 of min(3, 2) still serve
            [engine("e0", "paused", 0), engine("e1", "paused", 1), replace(REPORTER, id="e2")],
            3,
            "ready",
            IN_A_JOB,
            None,
            id="in-a-job-enough-serve",
        ),
        pytest.param(
            [survivor(), engine("e1", rank=1)], 2, "ready", None, None, id="no-report-the-pass-confirms"
        ),
        pytest.param(
            [survivor(broken_generation=0), engine("e1", rank=1)], 2, "ready", None, None, id="an-older-break"
        ),
        pytest.param([REPORTER, engine("e1", rank=1)], 2, "degraded", None, None, id="already-degraded"),
        pytest.param([REPORTER], 0, "ready", None, None, id="size-0"),
    ],
)
def test_a_reported_break_degrades_at_once_when_fewer_serve_and_decides_nothing_else(
    engines: list[EngineSeen], size: int, status: str, active: JobSeen | None, written: str | None
) -> None:
    """Issue 34: the first heartbeat reporting a member's group broken writes the status in its own
    transaction (`liveness.reported`): a read between it and the pass it wakes said `ready` with fewer
    serving. No confirmation (no heartbeat racing a switch reports a break of the recorded generation);
    no fate, fence or heal: those stay the pass's."""
    reason = "members-missing" if status == "degraded" else None
    seen = view(engines, size=size, status=status, reason=reason, active=active)
    found = judge_reported_break(seen, NOW, RULES)
    assert found.engines == () and found.memory is None and found.action == NoJob(REPORTED_BREAK)
    if written is None:
        assert found.status is None, found.status
        return
    assert found.status is not None and (found.status.status, found.status.reason) == (
        "degraded",
        "members-missing",
    )
    assert found.status.message.startswith(written) and found.status.serving == 1, found.status
    assert found.status.hit_job_id == (active.id if active else None)


# --- a process that is gone ------------------------------------------------------------------------------


def test_a_member_whose_process_is_gone_is_lost_before_its_heartbeat_timeout() -> None:
    seen = view([survivor(), engine("e1", rank=1, heard=1, process_gone=True)], policy="shrink")
    found = verdict(seen)
    assert found.fate("e1") is Fate.written_off and found.engines[0].announce_unreachable
    assert found.job is not None and found.job.target == 1 and "e1" in found.job.reason


def test_an_engine_that_answers_or_is_frozen_is_not_gone() -> None:
    """The probe says False for a slow answer, a frozen listener, a foreign TLS certificate (8a4b695):
    the heartbeat timeout decides."""
    seen = view([survivor(), engine("e1", rank=1, heard=1, process_gone=False)], policy="shrink")
    assert verdict(seen).fate("e1") is None


def test_only_the_engines_on_a_broken_generation_no_job_runs_are_probed() -> None:
    whole = view(members(2))
    assert probe_targets(whole) == []
    broken = view([survivor(), engine("e1", rank=1)])
    assert [e.id for e in probe_targets(broken)] == ["e1"]
    assert probe_targets(replace(broken, active_job=job("j1", "preparing", ended=1))) == []


# --- a stalled (frozen) member ---------------------------------------------------------------------------


def named_by_survivor(*, named: bool = True, heard: float = 3.0) -> list[EngineSeen]:
    """Rank 1 froze: its row still serves; rank 0 left the broken group and reported it 2 s ago."""
    reporter = survivor(
        broken_generation=1, broken_reported_at=ago(2), unresponsive_peers=("e1",) if named else ()
    )
    return [reporter, engine("e1", rank=1, heard=heard)]


def test_a_member_every_survivor_named_and_not_heard_since_is_fenced_at_once() -> None:
    found = verdict(view(named_by_survivor()))
    (fenced,) = found.engines
    assert (fenced.fate, fenced.state, fenced.dp_rank, fenced.release) == (
        Fate.stalled,
        "fenced",
        None,
        False,
    )
    assert (
        found.status is not None and found.status.reason == "engine-stalled" and "e1" in found.status.message
    )
    assert found.memory is not None and found.memory.loss_at == ago(3) and found.memory.target == 2
    assert found.job is not None and found.job.target == 1
    assert "e1 (stalled: named by every survivor)" in found.job.reason


@pytest.mark.parametrize(
    ("named", "heard"), [pytest.param(False, 3.0, id="not-named"), pytest.param(True, 1.0, id="heard-since")]
)
def test_no_fence_without_the_evidence(named: bool, heard: float) -> None:
    assert verdict(view(named_by_survivor(named=named, heard=heard))).fate("e1") is None


def test_a_member_named_by_every_survivor_inside_a_job_is_fenced_not_left_for_its_timeout() -> None:
    """Issue 34: frozen inside a job (in prepare, or in the commit window), the survivors named it when
    their group broke; the job ends at its own deadlines, but the evidence is judged now, before its
    heartbeat timeout would write it off and stop it. Nothing else is decided while the job runs."""
    running = job("j1", "committing", by="operator", ended=1)
    found = verdict(view(named_by_survivor(), active=running))
    assert found.fate("e1") is Fate.stalled
    assert found.job is None and found.action == NoJob(f"{why.JOB_OWNS_IT} (j1)")
    silent_too = verdict(view(named_by_survivor(heard=20.0), active=running))
    assert silent_too.fate("e1") is Fate.stalled  # fenced, not lost


def test_no_verdict_until_every_member_spoke() -> None:
    """A third member left without saying so, not heard since the first report (its report may be on
    its way): not every member spoke."""
    engines = [*named_by_survivor(), survivor("e2", heard=3.0)]
    assert verdict(view(engines, size=3)).fate("e1") is None


def test_a_member_that_left_before_the_group_broke_is_no_witness() -> None:
    """Issue 34: a leaver switched at a commit window's boundary, the window a frozen member held open
    failed, and the member that went back reported the old generation broken, naming the frozen one.
    The leaver, idle and heard since that report with no break to report, was not in the group when it
    broke: the frozen one is fenced on the one survivor's evidence (it used to wait for its heartbeat
    timeout and be written off and stopped)."""
    engines = [*named_by_survivor(), survivor("e2", heard=1.0)]
    found = verdict(view(engines, size=3))
    assert found.fate("e1") is Fate.stalled
    assert found.job is not None and found.job.target == 2  # the new generation on e0 and the leaver
    # ... but not one that last heartbeat before the report, nor one that reported another break
    assert verdict(view([*named_by_survivor(), survivor("e2", heard=3.0)], size=3)).fate("e1") is None
    other_break = survivor("e2", broken_generation=1, broken_reported_at=ago(1), unresponsive_peers=())
    assert verdict(view([*named_by_survivor(), other_break], size=3)).fate("e1") is None


# --- the status from the engines --------------------------------------------------------------------------


def test_a_deployment_whose_members_serve_its_generation_again_is_ready() -> None:
    found = verdict(view(members(2), status="degraded", reason="members-missing"))
    assert found.status is not None and (found.status.status, found.status.reason) == ("ready", None)


def test_a_group_that_broke_under_live_engines_degrades_once_it_stayed_so() -> None:
    """A heartbeat sent just before a switch and received just after it proves nothing yet."""
    seen = view([survivor(), engine("e1", rank=1)])
    first = verdict(seen)
    assert first.status is None and first.broken_since == NOW
    confirmed = verdict(replace(seen, broken_since=ago(3)))
    assert confirmed.status is not None and confirmed.status.reason == "members-missing"
    assert "on no generation: e0" in confirmed.status.message


def test_two_engines_claiming_one_rank_is_a_generation_split() -> None:
    found = verdict(view([*members(2), engine("e2", rank=1)]), rules=NO_CONFIRM)
    assert found.status is not None and found.status.reason == "generation-split"


def test_a_second_group_beside_a_whole_generation_is_a_generation_split() -> None:
    """A switch that failed part-way: a joiner serves the next generation on its own."""
    found = verdict(view([*members(2), engine("e2", rank=2, gen=2)]), rules=NO_CONFIRM)
    assert found.status is not None and found.status.reason == "generation-split"
    assert "serving another generation: e2 (generation 2)" in found.status.message


def test_a_member_missing_stays_the_reason_beside_a_stray() -> None:
    """Self-healing re-forms the generation on what there is (the stray's group ends at its deadline)."""
    found = verdict(view([engine("e0", rank=0, gen=2), survivor("e1")]), rules=NO_CONFIRM)
    assert found.status is not None and found.status.reason == "members-missing"
    assert "serving another generation: e0 (generation 2)" in found.status.message


def test_a_reason_health_gave_follows_the_engines_and_another_rules_is_kept() -> None:
    engines = [survivor(), engine("e1", "fenced", heard=3)]
    assert verdict(view(engines, status="degraded", reason="engine-stalled"), rules=NO_CONFIRM).status is None
    moved = verdict(view(engines, status="degraded", reason="engine-unreachable"), rules=NO_CONFIRM)
    assert moved.status is not None and moved.status.reason == "members-missing"
    assert not moved.status.announce_again  # no second event


def test_an_engine_that_refuses_the_agent_key_is_never_counted_as_serving() -> None:
    """Issue 32's condition (`engine-refuses-agent-key`): the deployment is not ready over it."""
    engines = [engine("e0", rank=0), engine("e1", rank=1, refuses_agent_key=True)]
    found = verdict(view(engines, policy="none"), rules=NO_CONFIRM)
    assert found.status is not None and found.status.status == "degraded"
    assert "refusing the agent key: e1" in found.status.message


# --- self-healing -----------------------------------------------------------------------------------------


def lost_member() -> list[EngineSeen]:
    """Rank 1 silent for 20 s; rank 0 left the broken group."""
    return [survivor(), engine("e1", rank=1, heard=20)]


def test_shrink_writes_off_the_lost_member_and_forms_a_generation_on_the_survivors() -> None:
    found = verdict(view(lost_member(), policy="shrink"))
    (gone,) = found.engines
    assert (gone.fate, gone.state, gone.release, gone.announce_unreachable) == (
        Fate.written_off, "left", True, True,
    )  # fmt: skip
    assert found.job == HealJob(1, "self-heal: lost e1 (silent 20.0 s); a new generation on 1", ago(20))
    assert found.memory is not None and (found.memory.lost, found.memory.loss_at, found.memory.target) == (
        "e1 (silent 20.0 s)", ago(20), None,
    )  # fmt: skip
    assert found.lost_to_incident == ((("e1",), ago(20)),)  # the loss dates from its last heartbeat


def test_the_new_generation_waits_until_no_survivor_is_left_on_the_broken_one() -> None:
    """A survivor still blocked in a collective of the broken group reports the old generation until its
    deadline: the lost engine is written off at once, the job waits for that survivor to leave."""
    found = verdict(view([engine("e0", rank=0), engine("e1", rank=1, heard=20)], policy="shrink"))
    assert found.fate("e1") is Fate.written_off and found.action == NoJob(why.WAITING)


def test_none_only_reports() -> None:
    found = verdict(view(lost_member(), policy="none"))
    assert found.fate("e1") is Fate.lost and found.engines[0].state == "unreachable"
    assert found.action == NoJob(why.POLICY_NONE)


def test_replace_keeps_the_size_and_grows_back_once_whole() -> None:
    shrink = verdict(view(lost_member(), policy="replace"))
    assert shrink.memory is not None and shrink.memory.target == 2
    healed = view(
        [engine("e0", rank=0, gen=2)],
        size=1,
        gen=2,
        heal_lost="e1 (silent 20.0 s)",
        heal_loss_at=ago(30),
        heal_target_dp_size=2,
        newest=(job("j1", ended=5, to_generation=2, to_dp_size=1),),
    )
    found = verdict(healed)
    assert found.job == HealJob(2, "self-heal: replace the lost engines, back to 2", ago(30), detected=False)
    assert found.memory is not None and found.memory.lost is None


def test_a_grow_back_waits_for_a_fenced_engine_within_the_grace() -> None:
    healed = view(
        [engine("e0", rank=0, gen=2), engine("e1", "fenced", heard=5)],
        size=1,
        gen=2,
        heal_lost="e1 (stalled: named by every survivor)",
        heal_target_dp_size=2,
        newest=(job("j1", ended=5, to_generation=2),),
    )
    assert verdict(healed).action == NoJob(why.FENCED_MAY_RETURN)
    past_grace = verdict(with_engine(healed, "e1", last_heartbeat_at=ago(20), updated_at=ago(20)))
    assert past_grace.fate("e1") is Fate.written_off and past_grace.engines[0].release
    assert past_grace.job is not None and past_grace.job.target == 2


def test_a_fenced_engine_that_heartbeats_is_never_written_off() -> None:
    """Its data link is cut: it heartbeats over the control network, and stays fenced."""
    healed = view(
        [engine("e0", rank=0, gen=2), engine("e1", "fenced", heard=1, data_unreachable=("e0",))],
        size=1,
        gen=2,
        heal_target_dp_size=2,
        newest=(job("j1", ended=60, to_generation=2),),
    )
    assert verdict(healed).action == NoJob(why.FENCED_MAY_RETURN)


@pytest.mark.parametrize(
    ("policy", "launcher", "idle", "target"),
    [
        ("shrink", "local", 2, 2),
        ("replace", "local", 2, 2),
        ("replace", "local", 1, 2),
        ("shrink", "static", 1, 1),
    ],
)
def test_a_group_broken_under_live_engines_is_re_formed_at_its_size(
    policy: str, launcher: str, idle: int, target: int
) -> None:
    """Every engine heartbeats and none serves (a collective failed, a switch failed part-way and the
    frozen member thawed): `replace` launches what is missing, `shrink` takes the engines there are."""
    engines = [survivor(f"e{i}") for i in range(idle)]
    seen = view(
        engines, status="degraded", reason="members-missing", since=ago(30), policy=policy, launcher=launcher
    )
    found = verdict(seen)
    assert found.job is not None and found.job.target == target and "broke" in found.job.reason
    assert found.job.loss_at == ago(30)  # counted from when the broken group was found


def test_losing_every_engine_with_replace_launches_fresh_ones_back_to_the_size() -> None:
    found = verdict(view(members(2, heard=20), policy="replace", newest_heard=1))
    assert found.job is not None and found.job.target == 2 and "fresh engines" in found.job.reason


def test_losing_every_engine_with_shrink_says_so_once_and_tries_nothing() -> None:
    found = verdict(view(members(2, heard=20), policy="shrink", newest_heard=1))
    assert found.status is not None and (found.status.reason, found.status.announce_again) == (
        "no-survivors",
        True,
    )
    assert found.action == NoJob(why.NO_SURVIVORS)
    again = view([], status="degraded", reason="no-survivors", policy="shrink", heal_lost="e0, e1")
    assert verdict(again, rules=NO_CONFIRM).status is None  # said once


def test_losing_the_only_engine_takes_an_idle_spare() -> None:
    seen = view([engine("e0", rank=0, heard=20), engine("spare", "idle")], size=1, policy="shrink")
    found = verdict(seen)
    assert found.job is not None and found.job.target == 1


def broken_in_place(newest: tuple[JobSeen, ...], reason: str = "members-missing") -> DeploymentView:
    return view(
        [survivor("e0"), survivor("e1")],
        status="degraded",
        reason=reason,
        policy="shrink",
        newest=newest,
    )


def test_self_healing_stops_after_failed_attempts_in_a_row() -> None:
    failed = tuple(job(f"j{i}", "rolled_back", ended=60 + i) for i in range(RULES.max_attempts))
    found = verdict(broken_in_place(failed))
    assert found.status is not None and (found.status.reason, found.status.announce_again) == (
        "self-heal-stopped", True,
    )  # fmt: skip
    assert found.action == NoJob(why.HEAL_STOPPED)
    assert verdict(broken_in_place(failed, "self-heal-stopped")).status is None  # said once


def test_a_failed_attempt_is_tried_again_after_the_retry_pause() -> None:
    assert verdict(broken_in_place((job("j1", "rolled_back", ended=5),))).action == NoJob(why.RETRY_PAUSE)
    assert verdict(broken_in_place((job("j1", "rolled_back", ended=11),))).job is not None


def test_an_operators_job_starts_the_count_again() -> None:
    newest = (job("op", "failed", by="api", ended=1), *(job(f"j{i}", "rolled_back") for i in range(3)))
    assert verdict(broken_in_place(newest)).job is not None


def test_a_loss_after_an_operators_job_starts_from_that_jobs_size() -> None:
    """e46addb: a stale replace target from an earlier heal, larger than the idle engines can fill,
    blocked the grow-back for good."""
    seen = view(
        lost_member(),
        heal_lost="old (silent 30.0 s)",
        heal_loss_at=ago(900),
        heal_target_dp_size=4,
        newest=(job("op", "succeeded", by="api", ended=300),),
    )
    found = verdict(seen)
    assert found.memory is not None
    assert (found.memory.lost, found.memory.loss_at, found.memory.target) == (
        "e1 (silent 20.0 s)",
        ago(20),
        2,
    )


def test_a_grow_back_is_dropped_when_an_operator_acted_since() -> None:
    seen = view(
        members(2), heal_target_dp_size=3, heal_loss_at=ago(60), newest=(job("op", by="api", ended=5),)
    )
    found = verdict(seen)
    assert found.action == NoJob(why.WHOLE) and found.memory is not None and found.memory.target is None


def test_a_cut_data_link_re_forms_on_the_largest_set_that_reaches_one_another_and_fences_the_rest() -> None:
    def left(name: str, cut: tuple[str, ...]) -> EngineSeen:
        return survivor(name, broken_generation=1, broken_reported_at=ago(2), data_unreachable=cut)

    engines = [left("e0", ("e2",)), left("e1", ("e2",)), left("e2", ("e0", "e1"))]
    found = verdict(view(engines, size=3, status="degraded", reason="members-missing"))
    (fenced,) = found.engines
    assert (fenced.engine_id, fenced.fate, fenced.state, fenced.release) == (
        "e2",
        Fate.cut_off,
        "fenced",
        False,
    )
    assert found.job is not None and found.job.target == 2


@pytest.mark.parametrize(
    ("unreachable", "largest"),
    [
        ({}, ["a", "b", "c", "d"]),
        ({"d": ["a", "b", "c"], "a": ["d"]}, ["a", "b", "c"]),  # one host cut off
        ({"a": ["c"], "b": ["d"]}, ["a", "b"]),  # two links down: the first-ranked of the largest sets
        ({"a": ["b", "c", "d"], "b": ["a"], "c": ["a"], "d": ["a"]}, ["b", "c", "d"]),  # rank 0's host
    ],
)
def test_the_largest_set_that_reaches_one_another(
    unreachable: dict[str, list[str]], largest: list[str]
) -> None:
    assert largest_reachable_set(["a", "b", "c", "d"], unreachable) == largest


# --- a starting coordinator's answers (adoption) ----------------------------------------------------------


def at_start(*answers: Asked, size: int = 2) -> DeploymentView:
    engines = [replace(e, asked=a) for e, a in zip(members(size), answers, strict=True)]
    return view(engines, size=size, at_start=True, watching_since=NOW)


def test_at_start_a_member_that_answers_something_else_is_recorded_as_it_says() -> None:
    found = verdict(at_start(Asked(Answer.serving), Asked(Answer.changed, "idle", 0, None, 0)))
    (changed,) = found.engines
    assert (changed.fate, changed.state, changed.generation, changed.dp_rank, changed.heard_at) == (
        Fate.answered, "idle", 0, None, NOW,
    )  # fmt: skip
    assert found.status is not None and found.status.reason == "members-missing"  # no confirmation wait


def test_at_start_a_member_where_nothing_listens_is_lost() -> None:
    found = verdict(at_start(Asked(Answer.serving), Asked(Answer.gone)))
    assert found.fate("e1") is Fate.written_off and found.engines[0].announce_unreachable
    assert found.status is not None and found.status.status == "degraded"


def test_at_start_a_member_that_does_not_answer_is_fenced() -> None:
    found = verdict(at_start(Asked(Answer.changed, "idle", 0, None, 0), Asked(Answer.silent)))
    assert found.fate("e1") is Fate.silent_at_start and found.status is not None


def test_at_start_the_one_silent_member_whose_peers_serve_with_it_is_a_lost_link() -> None:
    found = verdict(at_start(Asked(Answer.serving), Asked(Answer.serving), Asked(Answer.silent), size=3))
    (cut,) = found.engines
    assert (cut.engine_id, cut.fate, cut.state) == ("e2", Fate.link_lost, "serving")


# --- the incident's job -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("newest", "hit"),
    [
        pytest.param(job("j1", ended=30), "j1", id="just-ended"),
        pytest.param(job("j1", ended=90), None, id="too-long-ago"),
        pytest.param(job("j1", "failed", ended=30), None, id="it-failed"),
        pytest.param(job("j1", ended=30, to_generation=0), None, id="another-generation"),
    ],
)
def test_an_incident_right_after_a_job_names_that_job(newest: JobSeen, hit: str | None) -> None:
    found = verdict(
        view([engine("e0", rank=0), engine("e1", rank=1, heard=20)], policy="none", newest=(newest,))
    )
    assert found.status is not None and found.status.hit_job_id == hit


# --- warm spares (issue 38) -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spares", "idle_spares", "target"),
    [
        (1, 1, 3),  # the spare takes the lost rank: back to the size in one job
        (2, 2, 3),  # never beyond the size: one spare stays a spare
        (1, 0, 2),  # its spare not launched yet: the survivors alone, grown back later
        (0, 1, 2),  # a deployment keeping no spares: an idle engine is left for the grow-back
    ],
)
def test_a_loss_heals_onto_the_warm_spares_back_to_the_size(
    spares: int, idle_spares: int, target: int
) -> None:
    broken = [survivor(f"e{i}", broken_generation=1) for i in range(2)]
    engines = [
        *broken,
        engine("e2", rank=2, heard=20),
        *(engine(f"s{i}", "idle") for i in range(idle_spares)),
    ]
    found = verdict(view(engines, size=3, policy="shrink", spares=spares))
    assert found.fate("e2") is Fate.written_off
    assert found.job is not None and found.job.target == target


def test_survivors_never_count_as_spares() -> None:
    """Idle on no generation like a spare, but they served the broken one: with no spare launched, the
    job is the survivors alone (a survivor counted as a spare would ask for more engines than there are
    only where other idle engines stand by, so this is checked on the rule itself)."""
    from app.backends.reference.liveness.heal import is_spare

    assert not is_spare(survivor("e0", broken_generation=1))
    assert is_spare(engine("s0", "idle"))
    assert not is_spare(engine("s0", "idle", refuses_agent_key=True))
