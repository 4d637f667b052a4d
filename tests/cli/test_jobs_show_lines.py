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
