"""`epctl-agent` logs in the format EPCTL_LOG_FORMAT (or --log-format) names: `json` lines carry the
agent's engine_id and deployment; a bad value stops start-up with the reason."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import AGENT_KEY_HEADERS, PYTHON, clean_environment, start_agents

pytestmark = pytest.mark.processes


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


def test_a_client_that_leaves_mid_body_costs_no_traceback(tmp_path: Path) -> None:
    """`/v1/infer` with half a body, then the connection closed: a problem ends the request quietly."""
    (agent,) = start_agents(["e0"], tmp_path, flags={"log_level": "info"})
    host, port = agent.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        head = "POST /v1/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        raw.sendall(head.encode() + b'content-length: 100000\r\n\r\n{"tokens": [[0.1')
        time.sleep(0.5)
    answer = httpx.get(f"{agent.url}/v1/info", timeout=10, headers=AGENT_KEY_HEADERS)
    assert answer.status_code == 200  # still serving
    agent.child.stop()
    log = agent.child.log_path.read_text()
    assert "Traceback" not in log and "ClientDisconnect" not in log, log[-3000:]
