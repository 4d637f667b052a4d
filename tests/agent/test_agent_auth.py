"""The agent plane's auth matrix, on real agent processes: every agent route x {no key, wrong key,
data key, control key}, each answer checked; the refused calls carry what would hurt (pause the
serving job for an hour, abort it, break its generation) and the serving generation is checked
unchanged after them, with a steady client that sees no failure throughout. Also: the data key on
`/v1/infer`, the fault routes absent from a production agent, bounded inputs, key rotation, the failure
metric, and no agent listener on a wildcard address (`ss -ltn`)."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from engine_agent import moe
from tests.agent.driver import SMALL, AgentProcess, Driver, random_tokens, start_agents, stop_agents
from tests.support.processes import AGENT_KEY, PYTHON

pytestmark = pytest.mark.processes

DATA_KEY = "epdk_test_" + secrets.token_urlsafe(16)
WRONG_KEY = "epak_wrong_" + secrets.token_urlsafe(16)
CALLERS = {
    "no key": None,
    "wrong key": WRONG_KEY,
    "data key": DATA_KEY,
    "control key": AGENT_KEY,
}


@dataclass
class Plane:
    serving: list[AgentProcess]  # one generation of two, fault injection on, data key set
    production: AgentProcess  # no test flag, no data key
    job_id: str
    generation: int


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    workdir = Path(tmp_path_factory.mktemp("auth"))
    serving = start_agents(2, workdir, env={"EPCTL_AGENT_DATA_KEY": DATA_KEY})
    production: list[AgentProcess] = []
    try:
        production = start_agents(1, workdir, prefix="p", extra_args=())
        driver = Driver()
        outcome = driver.reconfigure(serving)
        yield Plane(serving, production[0], outcome.job_id, driver.generation)
    finally:
        stop_agents([*serving, *production])


def call(agent: AgentProcess, key: str | None, method: str, path: str, body: object = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    with httpx.Client(base_url=agent.url, timeout=30) as http:
        return http.request(method, path, json=body, headers=headers)


def harmful(plane: Plane) -> list[tuple[str, str, object]]:
    """Every control route, with a body that would hurt the serving generation if it were obeyed."""
    job = {"job_id": plane.job_id}
    return [
        ("GET", "/v1/info", None),
        ("GET", "/v1/reconfig", None),
        ("GET", f"/v1/reconfig?job_id={plane.job_id}&wait_s=1", None),
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
        ("POST", "/v1/generation/broken", {"generation": plane.generation, "reason": "evil"}),
        ("POST", "/v1/faults", {"fail_next_switch": True, "fail_next_cleanup": True}),
        ("POST", "/v1/agent-key", {"key": WRONG_KEY, "overlap_s": 1}),
    ]


# With the control key: a call that cannot hurt, and the answer it must get.
HARMLESS: dict[str, tuple[object, int]] = {
    "/v1/info": (None, 200),
    "/v1/reconfig": (None, 200),
    "/v1/reconfig/prepare": ({}, 422),
    "/v1/reconfig/sync": ({"job_id": "another"}, 409),
    "/v1/reconfig/pause": ({"job_id": "another"}, 409),
    "/v1/reconfig/switch": ({"job_id": "another"}, 409),
    "/v1/reconfig/arm": ({"job_id": "another", "deadline_s": 1}, 409),
    "/v1/reconfig/resume": ({"job_id": "another"}, 409),
    "/v1/reconfig/abort": (None, 409),  # the committed job's own id (another's would be recorded)
    "/v1/cleanup": (None, 200),
    "/v1/cleanup/retry": (None, 409),
    "/v1/cleanup/acknowledge": (None, 409),
    "/v1/generation/broken": ({"generation": 999}, 200),
    "/v1/faults": ({}, 200),
    "/v1/agent-key": ({"key": "short", "overlap_s": 1}, 422),
}


class SteadyInfer:
    """One `/v1/infer` after another (with the data key) while the matrix runs; counts what failed."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent, self.ok = agent, 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.tokens = random_tokens(SMALL, 2).tolist()

    def _run(self) -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {DATA_KEY}"}) as http:
            while not self._stop.is_set():
                answer = http.post(f"{self.agent.url}/v1/infer", json={"tokens": self.tokens})
                if answer.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"{answer.status_code} {answer.text[:200]}")

    def __enter__(self) -> SteadyInfer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def assert_serving_unchanged(plane: Plane) -> None:
    for agent in plane.serving:
        info = agent.info()
        assert (info.generation, str(info.state)) == (plane.generation, "serving"), info
        status = agent.status()
        assert status.job_id == plane.job_id and str(status.phase) == "committed", status
    tokens = random_tokens(SMALL, 3)
    answer = plane.serving[0].infer(tokens)
    assert answer.status_code == 200, answer.text
    got = torch.tensor(answer.json()["outputs"])
    assert torch.allclose(got, moe.reference_forward(SMALL, tokens), rtol=1e-5, atol=1e-6)


def test_every_control_route_refuses_all_but_the_control_key_and_changes_nothing(plane: Plane) -> None:
    target = plane.serving[1]
    with SteadyInfer(plane.serving[0]) as steady:
        for caller, key in CALLERS.items():
            if key == AGENT_KEY:
                continue
            for method, path, body in harmful(plane):
                answer = call(target, key, method, path, body)
                where = f"{caller}: {method} {path}"
                assert answer.status_code == 401, f"{where}: {answer.status_code} {answer.text}"
                assert answer.headers["content-type"] == "application/problem+json", where
                code = "agent-key-required" if key is None else "agent-key-invalid"
                assert answer.json()["code"] == code, where
                assert answer.headers["www-authenticate"].startswith("Bearer"), where
                assert plane.job_id not in answer.text and "store" not in answer.text, where
        assert_serving_unchanged(plane)
        for method, path, _ in harmful(plane):
            bare = path.split("?")[0]
            body, expected = HARMLESS[bare]
            body = {"job_id": plane.job_id} if bare == "/v1/reconfig/abort" else body
            answer = call(target, AGENT_KEY, method, path if method == "GET" else bare, body)
            assert answer.status_code == expected, f"control key: {method} {path}: {answer.text}"
        # The control key's own answers changed nothing either.
        assert_serving_unchanged(plane)
    assert steady.failed == [] and steady.ok > 0, steady.failed[:3]


def test_refusals_are_counted_without_a_secret_in_the_metrics(plane: Plane) -> None:
    target = plane.serving[1]
    before = refused_count(target)
    assert call(target, None, "GET", "/v1/info").status_code == 401
    assert call(target, WRONG_KEY, "GET", "/v1/info").status_code == 401
    assert refused_count(target) == before + 2
    metrics = call(target, None, "GET", "/metrics")  # open, like /healthz
    assert metrics.status_code == 200 and call(target, None, "GET", "/healthz").status_code == 200
    for secret in (AGENT_KEY, DATA_KEY, WRONG_KEY, plane.job_id):
        assert secret not in metrics.text
    assert "refused GET /v1/info from 127.0.0.1: wrong control key" in target.log_path.read_text()


def refused_count(agent: AgentProcess) -> float:
    text = call(agent, None, "GET", "/metrics").text
    found = re.findall(r'^epctl_agent_auth_failures_total\{plane="control",reason="\w+"\} (\S+)$', text, re.M)
    return sum(float(value) for value in found)


def test_the_data_key_guards_infer_and_no_more(plane: Plane) -> None:
    tokens = {"tokens": random_tokens(SMALL, 1).tolist()}
    expected = {"no key": 401, "wrong key": 401, "data key": 200, "control key": 200}
    for caller, key in CALLERS.items():
        answer = call(plane.serving[0], key, "POST", "/v1/infer", tokens)
        assert answer.status_code == expected[caller], f"{caller}: {answer.text}"
        if answer.status_code == 401:
            assert answer.json()["code"] == ("data-key-required" if key is None else "data-key-invalid")
    # Without a data key (the default) inference is open (past the check: this idle engine has no
    # generation to serve, 503); its control routes are not.
    assert call(plane.production, None, "POST", "/v1/infer", tokens).status_code == 503
    assert call(plane.production, DATA_KEY, "GET", "/v1/info").status_code == 401


def test_a_production_agent_has_no_fault_routes(plane: Plane) -> None:
    for key in (None, AGENT_KEY):
        answer = call(plane.production, key, "POST", "/v1/faults", {"fail_next_switch": True})
        assert answer.status_code == 404 and answer.json()["code"] == "not-found", answer.text
    assert call(plane.serving[0], AGENT_KEY, "POST", "/v1/faults", {}).status_code == 200


def test_leases_deadlines_and_timeouts_past_their_bounds_are_422(plane: Plane) -> None:
    agent = plane.serving[1]
    job = {"job_id": plane.job_id}
    for path, body in (
        ("/v1/reconfig/pause", {**job, "lease_s": 3600}),
        ("/v1/reconfig/arm", {**job, "deadline_s": 86400}),
        ("/v1/reconfig/arm", {**job, "deadline_s": 10, "lease_s": 3600}),
    ):
        answer = call(agent, AGENT_KEY, "POST", path, body)
        assert answer.status_code == 422, f"{path} {body}: {answer.status_code} {answer.text}"
    request = Driver(generation=plane.generation, members=plane.serving).prepare_request(plane.serving)
    wire = request.model_dump(mode="json")
    for field, value in (("pause_lease_s", 3600), ("collective_s", 86400), ("transfer_s", 86400)):
        bad = {**wire, "timeouts": {**wire["timeouts"], field: value}}
        answer = call(agent, AGENT_KEY, "POST", "/v1/reconfig/prepare", bad)
        assert answer.status_code == 422, f"{field}: {answer.text}"
    assert_serving_unchanged(plane)


def test_a_rotated_key_is_accepted_with_the_previous_one_during_the_overlap(plane: Plane) -> None:
    agent = plane.production
    new_key = "epak_new_" + secrets.token_urlsafe(16)
    assert call(agent, new_key, "GET", "/v1/info").status_code == 401
    rotated = call(agent, AGENT_KEY, "POST", "/v1/agent-key", {"key": new_key, "overlap_s": 600})
    assert rotated.status_code == 200, rotated.text
    assert call(agent, new_key, "GET", "/v1/info").status_code == 200
    assert call(agent, AGENT_KEY, "GET", "/v1/info").status_code == 200  # within the overlap
    assert call(agent, WRONG_KEY, "GET", "/v1/info").status_code == 401


def test_no_agent_listens_on_a_wildcard_address(plane: Plane) -> None:
    """The HTTP API on its control address, the rendezvous store (TCPStore) and the gloo devices on
    the data address: none on 0.0.0.0, [::] or *."""
    listing = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    agents = [*plane.serving, plane.production]
    found: dict[int, list[str]] = {agent.process.pid: [] for agent in agents}
    for line in listing.splitlines():
        for pid in found:
            if f"pid={pid}," in line:
                found[pid].append(line.split()[3])
    for agent in agents:
        listeners = found[agent.process.pid]
        store = agent.info().store
        assert f"{store.host}:{store.port}" in listeners, (agent.engine_id, listeners)
        assert len(listeners) >= 2, listeners  # HTTP and the store at least
        wild = [a for a in listeners if a.startswith(("0.0.0.0:", "[::]:", "*:"))]
        assert wild == [], f"{agent.engine_id} listens on {wild}"


def test_an_agent_without_a_key_refuses_to_start() -> None:
    """Unless started with --insecure-no-agent-key (development), which the message names."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("EPCTL_AGENT_")}
    result = subprocess.run(
        [PYTHON, "-m", "engine_agent.main", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "no agent key: set EPCTL_AGENT_KEY" in result.stderr and "--insecure-no-agent-key" in result.stderr
