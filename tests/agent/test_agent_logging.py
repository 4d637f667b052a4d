"""`epctl-agent` logs in the format EPCTL_LOG_FORMAT (or --log-format) names: `json` lines carry the
agent's engine_id and deployment; a bad value stops start-up with the reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.processes import PYTHON, clean_environment, start_agents


def test_json_log_lines_carry_the_engine_and_the_deployment(tmp_path: Path) -> None:
    (agent,) = start_agents(
        ["e0"], tmp_path, flags={"log_level": "info", "deployment": "d1"}, env={"EPCTL_LOG_FORMAT": "json"}
    )
    agent.child.stop()
    lines = [line for line in agent.child.log_path.read_text().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    serving = [r for r in records if r["message"].startswith("agent e0 serving at")]
    assert serving, agent.child.log_tail()
    assert {"time", "level", "logger", "message"} <= set(serving[0])
    assert (serving[0]["engine_id"], serving[0]["deployment"]) == ("e0", "d1")
    assert any(r["logger"].startswith("uvicorn") for r in records), records


def test_an_unknown_log_format_stops_the_agent_with_the_reason() -> None:
    result = subprocess.run(
        [PYTHON, "-m", "engine_agent.main", "--port", "0"],
        env=clean_environment({"EPCTL_LOG_FORMAT": "xml"}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "EPCTL_LOG_FORMAT must be one of text, json, not 'xml'" in result.stderr
