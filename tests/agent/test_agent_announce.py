"""An agent started with --coordinator registers itself (POST /v1/engines) and sends heartbeats with
its bearer token; an unreachable coordinator does not stop it from serving."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine_agent.protocol import AgentHeartbeat, AgentRegistration
from tests.agent.driver import AgentProcess

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]


class Recorder(ThreadingHTTPServer):
    calls: list[tuple[str, str, dict[str, object]]]


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.calls.append((self.path, self.headers.get("Authorization", ""), body))
        self.send_response(200 if self.path.endswith("heartbeat") else 201)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def coordinator() -> Iterator[Recorder]:
    server = Recorder(("127.0.0.1", 0), Handler)
    server.calls = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_an_agent_registers_and_heartbeats_with_its_token(spawn_agents: Spawn, coordinator: Recorder) -> None:
    url = f"http://127.0.0.1:{coordinator.server_address[1]}"
    (agent,) = spawn_agents(
        1,
        extra_args=(
            "--coordinator",
            url,
            "--deployment",
            "demo",
            "--token",
            "s3cret",
            "--heartbeat-s",
            "0.1",
        ),
    )
    deadline = time.monotonic() + 20
    while len(coordinator.calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    (path, auth, body), *beats = coordinator.calls
    assert path == "/v1/engines" and auth == "Bearer s3cret"
    registration = AgentRegistration.model_validate(body)
    assert (registration.engine_id, registration.deployment, registration.url) == ("e0", "demo", agent.url)
    assert beats and beats[0][0] == "/v1/engines/e0/heartbeat"
    assert AgentHeartbeat.model_validate(beats[0][2]).state == "idle"


def test_an_unreachable_coordinator_does_not_stop_the_agent(spawn_agents: Spawn) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    (agent,) = spawn_agents(
        1,
        extra_args=(
            "--coordinator",
            f"http://127.0.0.1:{closed_port}",
            "--deployment",
            "d",
            "--heartbeat-s",
            "0.1",
        ),
    )
    time.sleep(0.3)
    assert agent.get("/healthz").status_code == 200
