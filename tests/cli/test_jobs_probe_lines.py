"""`epctl jobs show` prints what the canary probe saw under the summary."""

from __future__ import annotations

from app.cli.jobs import probe_lines


def test_probe_lines_show_the_rate_the_prepare_cost_and_unreachable_engines() -> None:
    job = {
        "probe": {
            "client_downtime_ms": 31.5,
            "canaries_sent": 120,
            "canaries_failed": 2,
            "targets": 2,
            "interval_ms": 20.0,
            "latency_p50_ms_outside_downtime": 4.2,
            "phases": {
                "before": {"p99_ms": 6.0, "longest_gap_ms": 21.0},
                "prepare": {"p99_ms": 40.0, "longest_gap_ms": 55.0},
            },
            "unreachable": {"e3": "ClientConnectorError: refused"},
        }
    }
    lines = "\n".join(probe_lines(job))
    assert "120 canaries to 2 engines" in lines and "2 failed" in lines
    assert "prepare cost" in lines and "55.0 ms" in lines and "21.0 ms" in lines
    assert "e3 (ClientConnectorError: refused)" in lines


def test_no_probe_no_lines() -> None:
    assert probe_lines({"probe": None}) == []
