"""What `epctl jobs show` prints: the client outage as the headline, the slowest answer with its phase
beside it, the probe's details under the summary, and each engine's own generation before and after."""

from __future__ import annotations

from typing import Any

import pytest

from app.cli.job_summary import engine_rows, print_summary
from app.cli.jobs import probe_lines

PROBE: dict[str, Any] = {
    "outage_ms": 0.0,
    "outage_phase": None,
    "slowest_answer_ms": 453.0,
    "slowest_answer_phase": "prepare",
    "deadline_ms": 1000.0,
    "canaries_sent": 120,
    "canaries_failed": 0,
    "canaries_late": 0,
    "targets": 2,
    "interval_ms": 20.0,
    "latency_p50_ms_outside_outage": 4.2,
    "phases": {
        "before": {"p99_ms": 6.0, "slowest_answer_ms": 7.5, "longest_gap_ms": 21.0},
        "prepare": {"p99_ms": 40.0, "slowest_answer_ms": 453.0, "longest_gap_ms": 470.0},
    },
    "unreachable": {"e3": "ClientConnectorError: refused"},
}


def summary(capsys: pytest.CaptureFixture[str], **job: Any) -> str:
    print_summary({"id": "rcfg_1", "state": "succeeded", "downtime_ms": 37.3, **job})
    return " ".join(capsys.readouterr().out.split())


def test_a_slow_job_without_failures_reads_outage_0_and_its_slowest_answer_in_prepare(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = summary(capsys, client_outage_ms=0.0, client_slowest_answer_ms=453.0, probe=PROBE)
    assert "downtime: 37.3 ms client outage: 0 ms slowest answer: 453 ms (prepare)" in out, out
    assert "120 sent, 0 failed, 0 late" in out
    assert "client downtime" not in out


def test_an_outage_names_its_phase(capsys: pytest.CaptureFixture[str]) -> None:
    probe = {**PROBE, "outage_ms": 1500.0, "outage_phase": "committing", "canaries_failed": 14}
    out = summary(capsys, client_outage_ms=1500.0, client_slowest_answer_ms=20.0, probe=probe)
    assert "client outage: 1.50 s (committing)" in out, out


def test_a_job_from_before_the_outage_shows_its_old_figure_as_such(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = summary(capsys, client_downtime_ms=453.0, probe={"canaries_sent": 80, "canaries_failed": 0})
    assert "client downtime (old figure): 453 ms" in out, out
    assert "client outage" not in out


def test_probe_lines_show_the_rate_the_deadline_the_prepare_cost_and_unreachable_engines() -> None:
    lines = "\n".join(probe_lines({"probe": PROBE}))
    assert "120 canaries to 2 engines every 20.0 ms, deadline 1.00 s" in lines
    assert "p50 outside the outage 4.20 ms" in lines
    assert "prepare cost" in lines and "slowest answer 453 ms (before 7.50 ms)" in lines
    assert "e3 (ClientConnectorError: refused)" in lines


def test_no_probe_no_lines() -> None:
    assert probe_lines({"probe": None}) == []


def test_each_engine_shows_its_own_generation_before_and_after() -> None:
    results = [
        {"engine_id": "e0", "role": "staying", "generation_before": 1, "generation_after": 2},
        {"engine_id": "e1", "role": "leaving", "generation_before": 1, "generation_after": None},
        {"engine_id": "e2", "role": "joining", "generation_before": None, "generation_after": None},
    ]
    finished = {r[0]: r[3] for r in engine_rows({"terminal": True, "engine_results": results})}
    assert finished == {"e0": "1 -> 2", "e1": "1 -> -", "e2": "- -> -"}
    running = {r[0]: r[3] for r in engine_rows({"terminal": False, "engine_results": results})}
    assert running["e1"] == "1 -> ?"  # not known until the job ends
    old_record = engine_rows({"terminal": True, "engine_results": [{"engine_id": "e0", "generation": 2}]})
    assert old_record[0][3] == "2"


def test_a_job_whose_probe_sent_no_canary_reads_not_measured_never_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = summary(capsys, client_outage_ms=0.0, probe={**PROBE, "canaries_sent": 0, "canaries_failed": 0})
    assert "client outage: not measured (no canary sent)" in out, out
    assert "client outage: 0 ms" not in out


def test_a_job_without_a_probe_reads_not_measured(capsys: pytest.CaptureFixture[str]) -> None:
    out = summary(capsys, client_outage_ms=None, probe=None)
    assert "client outage: not measured (no canary probe ran)" in out, out


def test_failed_canaries_without_an_outage_say_another_engine_answered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = summary(capsys, client_outage_ms=0.0, probe={**PROBE, "canaries_failed": 2})
    assert "client outage: 0 ms (failed canaries were answered elsewhere in time)" in out, out


def test_the_jobs_list_puts_the_client_outage_beside_the_downtime() -> None:
    from app.cli.jobs import JOB_COLUMNS, job_rows

    measured = {"downtime_ms": 6.67, "client_outage_ms": 4550.0, "probe": PROBE}
    unmeasured = {"downtime_ms": 0.0, "client_outage_ms": 0.0, "probe": {"canaries_sent": 0}}
    rows = job_rows([measured, unmeasured])
    at = JOB_COLUMNS.index("DOWNTIME")
    assert JOB_COLUMNS[at + 1] == "CLIENT OUTAGE"
    assert [row[at : at + 2] for row in rows] == [["6.67 ms", "4.55 s"], ["0 ms", "not measured"]]


def test_a_self_heal_job_shows_its_loss_times_and_its_incident() -> None:
    from app.cli.job_summary import self_heal_lines

    job = {
        "loss_at": "2026-12-06T07:12:39.100000",
        "time_to_detect_ms": 812.0,
        "time_to_serving_ms": 1800.0,
        "incident_id": "inc_1",
    }
    incident = {"id": "inc_1", "state": "resolved", "reason": "engine-lost", "client_outage_ms": 1800.0}
    lines = self_heal_lines(job, incident)
    assert lines[0] == (
        "[bold]loss:[/] at 2026-12-06 07:12:39 UTC, detected after 812 ms, serving again after 1.80 s"
    )
    assert "inc_1 (resolved, engine-lost): client outage 1.80 s from the loss" in lines[1]
    assert "epctl incidents show inc_1" in lines[1]
    assert self_heal_lines({"incident_id": "inc_2"}, None) == [
        "[bold]incident:[/] inc_2; `epctl incidents show inc_2`"
    ]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (0.42, "0.42 ms"),
        (6.67, "6.67 ms"),
        (18, "18.0 ms"),
        (320, "320 ms"),
        (1920, "1.92 s"),
        (37700, "37.7 s"),
        (125_000, "2 min 5 s"),
    ],
)
def test_one_duration_format(ms: float, text: str) -> None:
    from app.cli.client import fmt_ms

    assert fmt_ms(ms) == text


def test_times_are_utc_with_the_zone_named() -> None:
    from app.cli.client import short_time

    assert short_time("2026-12-06T07:12:39+01:00") == "2026-12-06 06:12:39 UTC"
    assert short_time("2026-12-06T07:12:39") == "2026-12-06 07:12:39 UTC"


def test_the_incidents_list_reads_not_measured_never_0() -> None:
    from app.cli.incidents import _outage_short

    assert _outage_short({"client_outage_ms": 1800.0, "state": "resolved"}) == "1.80 s"
    assert _outage_short({"client_outage_ms": None, "outage_evidence": "not-measured"}) == "not measured"
    assert _outage_short({"client_outage_ms": None, "state": "open"}) == "not over"


def test_the_live_panel_shows_the_time_spent_in_the_step() -> None:
    from rich.console import Console

    from app.cli.progress_view import ProgressView

    progress = {"step": "launching", "percent": 0}
    job = {"id": "rcfg_1", "deployment": "demo", "state": "preparing", "progress": progress}
    view = ProgressView(live=False)
    view.update(job)
    view.step_since -= 12.4  # as if the launch began 12 s ago
    console = Console(width=160, record=True)
    console.print(view)
    assert "launching · 12 s in this step" in console.export_text()


def test_piped_progress_says_still_when_a_step_holds(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.progress_view import ProgressView

    job = {"id": "rcfg_1", "state": "preparing", "progress": {"step": "launching", "percent": 0}}
    view = ProgressView(live=True)
    assert not view.interactive
    view.update(job)
    view.tick()  # just printed: nothing more
    view.last_printed -= view.STILL_EVERY_S
    view.update(job)  # nothing changed, but 10 s went by
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[1].endswith("launching  (still; 0 s in this step)"), lines


def test_a_cancelled_job_shows_no_new_generation_and_no_error(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.job_summary import describe_failure

    job = {
        "id": "rcfg_9",
        "state": "cancelled",
        "from_generation": 3,
        "to_generation": 4,
        "error": {"phase": "preparing", "type": "cancelled", "message": "cancelled by admin"},
    }
    out = summary(capsys, **job)
    assert "generation 3 (unchanged)" in out and "3 -> 4" not in out, out
    assert "cancelled during preparing: cancelled by admin" in out and "error" not in out, out
    assert describe_failure(job) == "job rcfg_9 was cancelled during preparing: cancelled by admin"


def test_the_front_doors_accounting_shows_under_the_downtime(capsys: pytest.CaptureFixture[str]) -> None:
    counted = {
        "requests": 71,
        "failed": {"5xx": 2, "connection": 0, "response": 1},
        "retried": 3,
        "redispatched": 1,
        "drained": {"e3": {"in_flight_at_drain": 1, "drained_ms": 18.0}},
    }
    out = summary(capsys, client_outage_ms=0.0, probe=PROBE, front_door_requests=counted)
    assert "front door: 71 requests, failed: 5xx 2, response 1, 3 retried, 1 redispatched" in out, out
    assert "leavers drained: 1 in flight, done in 18.0 ms" in out, out
    assert "front door" not in summary(capsys, client_outage_ms=0.0, probe=PROBE)
    senders = {"clients": {"requests": 60, "failed": 1}, "canaries": {"requests": 11, "failed": 0}}
    out = summary(
        capsys, client_outage_ms=0.0, probe=PROBE, front_door_requests={**counted, "by_sender": senders}
    )
    assert "front door: 71 requests (60 from clients, 1 of them failed; 11 canaries), failed: 5xx 2" in out, (
        out
    )
