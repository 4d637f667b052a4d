"""Log lines: `EPCTL_LOG_FORMAT=text` (the default) for people, `json` (one object per line, with the job,
engine and deployment ids when known) for log pipelines; a bad value stops start-up with the reason."""

from __future__ import annotations

import io
import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.config import ConfigError, load_settings
from engine_agent.logs import formatter, log_context, log_fields, set_process_fields
from tests.support.processes import Coordinator, clean_environment, epctl_command


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing to a buffer (the test process's own logging is left alone)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    logger = logging.getLogger(f"epctl.test.{id(buffer)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield logger, buffer
    logger.removeHandler(handler)
    set_process_fields(engine_id=None)


def use(logger: logging.Logger, log_format: str) -> None:
    logger.handlers[0].setFormatter(formatter(log_format))  # type: ignore[arg-type]


def test_json_lines_have_time_level_logger_message_and_the_ids_of_their_context(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, buffer = capture
    use(logger, "json")
    logger.info("outside")
    with log_context(job_id="j1", deployment="demo"):
        logger.warning("inside %s", "the job")
        logger.warning("one engine", extra=log_fields(engine_id="e3"))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed")
    outside, inside, engine, failed = (json.loads(line) for line in buffer.getvalue().splitlines())
    assert set(outside) == {"time", "level", "logger", "message"}
    assert (outside["level"], outside["logger"], outside["message"]) == ("info", logger.name, "outside")
    assert outside["time"].endswith("+00:00")
    assert inside["message"] == "inside the job"
    assert (inside["job_id"], inside["deployment"], inside["level"]) == ("j1", "demo", "warning")
    assert (engine["engine_id"], engine["job_id"]) == ("e3", "j1")
    assert "job_id" not in failed and "RuntimeError: boom" in failed["exception"]


def test_text_lines_end_with_the_ids_they_know(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buffer = capture
    use(logger, "text")
    set_process_fields(engine_id="e0")
    logger.info("plain")
    with log_context(job_id="j9"):
        logger.warning("for a job")
    plain, job = buffer.getvalue().splitlines()
    assert f" INFO {logger.name}: plain [engine_id=e0]" in plain
    assert job.endswith(f"WARNING {logger.name}: for a job [job_id=j9 engine_id=e0]")


def test_an_unknown_log_format_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPCTL_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="log_format"):
        load_settings()


@pytest.mark.processes
def test_epctl_serve_with_an_unknown_log_format_exits_with_the_reason(tmp_path: Path) -> None:
    result = subprocess.run(
        [*epctl_command(), "serve"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=clean_environment({"EPCTL_LOG_FORMAT": "xml"}),
        check=False,
    )
    assert result.returncode == 2
    assert "log_format" in result.stderr and "'text' or 'json'" in result.stderr


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.processes
def test_a_running_coordinator_writes_every_log_line_in_its_format(tmp_path: Path, log_format: str) -> None:
    """`epctl serve` (uvicorn's own lines included) and `uvicorn app.main:app` alike."""
    for command in ("serve", "uvicorn"):
        work = tmp_path / command
        coordinator = Coordinator(
            f"sqlite:///{work / 'coordinator.db'}",
            work,
            env={"EPCTL_LOG_FORMAT": log_format},
            command=command,  # type: ignore[arg-type]
        )
        with coordinator:
            pass  # started (it logs that), then stopped
        lines = [line for line in coordinator.log_tail(100_000).splitlines() if line.strip()]
        if log_format == "json":
            records = [json.loads(line) for line in lines]  # every line is one JSON object
            assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records
            assert any(r["logger"] == "app.main" for r in records), records
            if command == "serve":  # uvicorn's own lines (at info there) go through the same handler
                assert any(r["logger"].startswith("uvicorn") for r in records), records
        else:
            assert any(" INFO app.main: coordinator started" in line for line in lines), lines
            assert not any(line.startswith("{") for line in lines), lines
