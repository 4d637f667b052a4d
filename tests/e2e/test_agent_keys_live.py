"""Keys that end when they should (issue 32), tried as an attacker would on a live `epctl up`: one
deployment (coordinator on SQLite, local reference engines) shared by the module, its cases in order.

- Launched engines hold none of the coordinator's secrets (`/proc/<pid>/environ`); their API docs load
  nothing from elsewhere.
- The whole life of a key: revealed once; rotated with a short overlap; a job inside the overlap
  launches an engine that gets the previous key *with its end*; inside the overlap the previous key
  still opens every engine but can rotate none; after it, it opens no route of any engine (the new
  one included), and the next job succeeds on the new key.
- 200 wrong tokens (coordinator) and keys (agent) from one client: 429 after a few, a few log lines,
  the real credentials working from another client.
- An engine that refuses the coordinator's key is a condition and no member; jobs are refused naming
  it; `epctl deployments agent-key demo --rotate` reports it and has the local launcher stop it, and
  self-healing brings the deployment back to its size on engines that hold the new key.

Real processes: one `epctl up` (a coordinator and 2-3 local agents) for the module, and `epctl` once.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.launchers.local import PIDS_FILE
from engine_agent.protocol import MIN_KEY_OVERLAP_S
from tests.support.processes import Child, clean_environment, epctl_command, free_port, spawn
from tests.support.waiting import wait_until

# The shortest overlap an agent takes: the job below starts its engine's launch (where the key and its end
# are handed over) within a second or two of the rotation; the whole job need not fit inside it.
OVERLAP_S = MIN_KEY_OVERLAP_S
# Wrong credentials sent to each server: twenty times the burst of 10, so unthrottled guessing would
# show as ~190 401s too many and ~200 log lines (1,000 took 45 s and showed nothing more).
GUESSES = 200
SECRET_KEY = "c2VhbGluZy1rZXktb2YtdGhlLWxpdmUtdGVzdC0wMzI="  # a Fernet key: the coordinator seals with it
ADMIN = "epctl_admin-token-of-the-live-test-0123456789"
HOST_SECRET = "a-cloud-credential-of-the-host"


@dataclass
class Live:
    up: Child
    url: str
    data: Path
    api: httpx.Client
    key: str = ""  # the deployment's agent key as the test knows it
    sources: Iterator[int] = field(default_factory=lambda: iter(range(1, 250)))

    def engines(self, state: str | None = "serving") -> list[dict[str, Any]]:
        found = self.api.get("/v1/engines", params={"deployment": "demo"}).json()["data"]
        return [e for e in found if state is None or e["state"] == state]

    def deployment(self) -> dict[str, Any]:
        return dict(self.api.get("/v1/deployments/demo").json())

    def pid_of(self, engine_id: str) -> int:
        return int(json.loads((self.data / PIDS_FILE).read_text())[engine_id]["pid"])

    def scale(self, size: int) -> dict[str, Any]:
        created = self.api.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": size})
        assert created.status_code == 202, created.text
        return self.wait_job(created.json()["id"])

    def wait_job(self, job_id: str) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            job = self.api.get(f"/v1/reconfigurations/{job_id}").json()
            return job if job["state"] in ("succeeded", "failed", "rolled_back", "cancelled") else None

        return self.up.wait_for(done, timeout_s=180, what=f"job {job_id} to end")

    def source(self) -> str:
        """A client address of its own (loopback has them all): each its own failure budget."""
        return f"127.0.3.{next(self.sources)}"


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def agent_call(
    url: str, key: str | None, method: str, path: str, body: object = None, source: str | None = None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = httpx.HTTPTransport(local_address=source) if source else None
    with httpx.Client(base_url=url, timeout=30, transport=transport) as client:
        return client.request(method, path, json=body, headers=headers)


def harmful(job_id: str, generation: int) -> list[tuple[str, str, object]]:
    """Every control route of an agent, with a body that would hurt if it were obeyed."""
    job = {"job_id": job_id}
    return [
        ("GET", "/v1/info", None),
        ("GET", "/v1/reconfig", None),
        ("POST", "/v1/reconfig/prepare", {"job_id": "evil"}),
        ("POST", "/v1/reconfig/sync", job),
        ("POST", "/v1/reconfig/pause", {**job, "lease_s": 60}),
        ("POST", "/v1/reconfig/switch", job),
        ("POST", "/v1/reconfig/arm", {**job, "deadline_s": 60}),
        ("POST", "/v1/reconfig/resume", job),
        ("POST", "/v1/reconfig/abort", job),
        ("GET", "/v1/cleanup", None),
        ("POST", "/v1/cleanup/retry", None),
        ("POST", "/v1/cleanup/acknowledge", None),
        ("POST", "/v1/generation/broken", {"generation": generation, "reason": "evil"}),
        ("POST", "/v1/agent-key", {"key": "epak_" + "x" * 40, "overlap_s": 10}),
    ]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("keys-live")
    port = free_port()
    env = clean_environment(
        {
            "EPCTL_RUNNER_LOCAL_AGENT_ARGS": "--heartbeat-s 1",
            "EPCTL_ADMIN_TOKEN": ADMIN,
            "EPCTL_SECRET_KEY": SECRET_KEY,
            "AWS_SECRET_ACCESS_KEY": HOST_SECRET,
            # Fresh interpreters, not the suite's zygote: these tests read each agent's environment from
            # /proc/PID/environ, which for a forked agent shows the zygote's (see engine-failures.md).
            "EPCTL_RUNNER_LOCAL_AGENT_ZYGOTE": "",
        }
    )
    argv = [*epctl_command(), "up", "--port", str(port), "--data-dir", str(tmp / "data")]
    up = spawn("epctl up", argv, tmp / "up.log", env=env, cwd=tmp)
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    )
    pids: list[int] = []
    try:
        up.wait_for(
            lambda: "export EPCTL_TOKEN=" in up.log_path.read_text(), timeout_s=120, what="epctl up to serve"
        )
        live = Live(up, f"http://127.0.0.1:{port}", tmp / "data", api)
        live.up.wait_for(lambda: len(live.engines()) == 2, timeout_s=60, what="two serving engines")
        yield live
    finally:
        api.close()
        if (tmp / "data" / PIDS_FILE).exists():
            pids = [int(e["pid"]) for e in json.loads((tmp / "data" / PIDS_FILE).read_text()).values()]
        if up.alive():
            up.popen.send_signal(signal.SIGINT)
            try:
                up.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
        for pid in pids:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)


def test_a_key_is_shown_once_and_no_engine_holds_the_coordinators_secrets(live: Live) -> None:
    shown = live.api.post("/v1/deployments/demo/agent-key")
    assert shown.status_code == 200, shown.text
    live.key = shown.json()["key"]
    assert live.api.post("/v1/deployments/demo/agent-key").status_code == 409  # once
    for engine in live.engines():
        given = environ(live.pid_of(engine["id"]))
        assert given["EPCTL_AGENT_KEY"] == live.key and "EPCTL_AGENT_KEY_PREVIOUS" not in given
        text = "\0".join(f"{k}={v}" for k, v in given.items())
        for secret in (ADMIN, SECRET_KEY, HOST_SECRET):
            assert secret not in text, engine["id"]
        assert not {"EPCTL_ADMIN_TOKEN", "EPCTL_SECRET_KEY", "AWS_SECRET_ACCESS_KEY", "DATABASE_URL"} & set(
            given
        )
        assert given["EPCTL_TOKEN"] and given["PATH"]  # what it needs: its token to register, the basics


def test_the_agent_docs_load_nothing_from_elsewhere(live: Live) -> None:
    url = live.engines()[0]["url"]
    page = agent_call(url, None, "GET", "/docs")
    assert page.status_code == 200
    references = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert references and all(ref.startswith("/") and not ref.startswith("//") for ref in references)
    assert all(agent_call(url, None, "GET", ref).status_code == 200 for ref in references)


def test_a_rotated_out_key_controls_nothing_after_its_overlap(live: Live) -> None:
    old = live.key
    rotated = live.api.post("/v1/deployments/demo/agent-key/rotate", json={"overlap_s": OVERLAP_S})
    assert rotated.status_code == 200, rotated.text
    body = rotated.json()
    new, ends = body["key"], datetime.fromisoformat(body["previous_valid_until"]).timestamp()
    assert sorted(body["pushed_to"]) == sorted(e["id"] for e in live.engines()) and body["not_pushed"] == {}
    live.key = new
    # Inside the overlap: the old key still opens the engines, but rotates none of them.
    for engine in live.engines():
        assert agent_call(engine["url"], old, "GET", "/v1/info").status_code == 200
        hijack = agent_call(
            engine["url"], old, "POST", "/v1/agent-key", {"key": "epak_" + "a" * 40, "overlap_s": 10}
        )
        assert (hijack.status_code, hijack.json()["code"]) == (401, "agent-key-not-current"), hijack.text
    # A job inside the overlap launches an engine: it gets the previous key with the overlap's end.
    job = live.scale(3)
    assert job["state"] == "succeeded", job
    engines = live.engines()
    assert len(engines) == 3
    joined = [e for e in engines if "EPCTL_AGENT_KEY_PREVIOUS" in environ(live.pid_of(e["id"]))]
    assert len(joined) == 1, "the engine launched inside the overlap has the previous key"
    given = environ(live.pid_of(joined[0]["id"]))
    assert given["EPCTL_AGENT_KEY"] == new and given["EPCTL_AGENT_KEY_PREVIOUS"] == old
    assert abs(float(given["EPCTL_AGENT_KEY_PREVIOUS_UNTIL"]) - ends) < 0.01
    # After the overlap: the old key opens no route of any engine, the new one included.
    wait_until(lambda: time.time() > ends + 1.0, timeout_s=OVERLAP_S + 30, what="the overlap to end")
    for engine in engines:
        for method, path, request in harmful(job["id"], live.deployment()["generation"]):
            answer = agent_call(engine["url"], old, method, path, request, source=live.source())
            assert answer.status_code == 401, (
                f"{engine['id']} {method} {path}: {answer.status_code} {answer.text}"
            )
        assert agent_call(engine["url"], new, "GET", "/v1/info").status_code == 200
    # The next job succeeds on the new key; nothing left to complain about.
    job = live.scale(2)
    assert job["state"] == "succeeded", job
    deployment = live.deployment()
    assert deployment["status"] == "ready" and deployment["conditions"] == [], deployment


def test_guessing_is_throttled_in_a_few_log_lines_and_real_credentials_work_elsewhere(live: Live) -> None:
    engine = live.engines()[0]
    coordinator_log = live.up.log_path
    agent_log = live.data / "agents" / f"{engine['id']}.log"
    before = (len(coordinator_log.read_text().splitlines()), len(agent_log.read_text().splitlines()))
    guesser = live.source()
    coordinator_statuses, agent_statuses = [], []
    started = time.monotonic()
    with httpx.Client(
        base_url=live.url, timeout=30, transport=httpx.HTTPTransport(local_address=guesser)
    ) as http:
        for _ in range(GUESSES):
            token = "epctl_" + secrets.token_urlsafe(30)
            coordinator_statuses.append(
                http.get("/v1/deployments", headers={"Authorization": f"Bearer {token}"}).status_code
            )
    with httpx.Client(
        base_url=engine["url"], timeout=30, transport=httpx.HTTPTransport(local_address=guesser)
    ) as http:
        for _ in range(GUESSES):
            key = "epak_" + secrets.token_urlsafe(30)
            agent_statuses.append(
                http.get("/v1/info", headers={"Authorization": f"Bearer {key}"}).status_code
            )
    elapsed = time.monotonic() - started
    for statuses in (coordinator_statuses, agent_statuses):
        assert statuses[:10] == [401] * 10 and set(statuses) == {401, 429}
        assert statuses.count(401) <= 10 + int(elapsed) + 1, (statuses.count(401), elapsed)
    grown = (
        len(coordinator_log.read_text().splitlines()) - before[0],
        len(agent_log.read_text().splitlines()) - before[1],
    )
    assert grown[0] <= 5 and grown[1] <= 5, grown
    # The real credentials, from another client: the admin token and the agent key.
    assert live.api.get("/v1/deployments").status_code == 200
    assert agent_call(engine["url"], live.key, "GET", "/v1/info").status_code == 200


def test_an_engine_that_refuses_the_key_is_a_condition_and_a_rotation_restarts_it(live: Live) -> None:
    victim = max(live.engines(), key=lambda e: e["dp_rank"])
    # Someone who held the current key gives the engine one the coordinator never had.
    foreign = "epak_foreign_" + secrets.token_urlsafe(24)
    pushed = agent_call(
        victim["url"], live.key, "POST", "/v1/agent-key", {"key": foreign, "overlap_s": MIN_KEY_OVERLAP_S}
    )
    assert pushed.status_code == 200, pushed.text

    def condition() -> list[dict[str, Any]] | None:
        return live.deployment()["conditions"] or None

    [shown] = live.up.wait_for(condition, timeout_s=30, what="the condition engine-refuses-agent-key")
    assert (shown["type"], shown["engine_id"]) == ("engine-refuses-agent-key", victim["id"])
    live.up.wait_for(
        lambda: live.deployment()["status"] == "degraded",
        timeout_s=30,
        what="the deployment not ready over it",
    )
    refused = live.api.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 3})
    assert refused.status_code == 409 and refused.json()["code"] == "engine-refuses-agent-key", refused.text
    # The way back without SSH: the CLI rotates, reports the engine, and its launcher stops it.
    cli_env = {**clean_environment(), "EPCTL_URL": live.url, "EPCTL_TOKEN": ADMIN}
    run = subprocess.run(
        [
            *epctl_command(),
            "deployments",
            "agent-key",
            "demo",
            "--rotate",
            "--overlap-s",
            str(MIN_KEY_OVERLAP_S),
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    live.key = run.stdout.strip()
    assert (
        live.key.startswith("epak_")
        and victim["id"] in run.stderr
        and "stopped by their launcher" in run.stderr
    )
    # Self-healing replaces it with an engine launched with the new key: ready at its size again.
    live.up.wait_for(
        lambda: (
            (d := live.deployment())["status"] == "ready"
            and d["current_dp_size"] == 2
            and not d["conditions"]
        ),
        timeout_s=180,
        what="the deployment healed on engines that hold the new key",
    )
    for engine in live.engines():
        assert engine["id"] != victim["id"]
        assert agent_call(engine["url"], live.key, "GET", "/v1/info").status_code == 200
