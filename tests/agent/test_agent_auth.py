"""The agent plane's auth matrix, on real agent processes: every agent route x {no key, wrong key,
data key, control key}, each answer checked; the refused calls carry what would hurt (pause the
serving job for an hour, abort it, break its generation) and the serving generation is checked
unchanged after them, with a steady client that sees no failure throughout. Also: the data key on
`/v1/infer`, the fault routes absent from a production agent, bounded inputs, the failure metric, and
no agent listener on a wildcard address (`ss -ltn`).

The life of a key on one more agent (`guarded`, with the default guessing limit): a previous key from
the environment whose end has passed is refused at once; a rotation's previous key works until its
overlap ends, never rotates, and a second rotation inside the overlap ends it at once; 1,000 wrong keys
from one address are throttled (429) after a few, in a few log lines, while the key works from another
address. And the big-body probe: four anonymous 200 MB bodies in parallel, refused before they are
read, the agent's memory unmoved, serving unaffected.

Real processes: four agents (two serving one generation), shared by the module."""

from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from engine_agent import moe
from engine_agent.protocol import MIN_KEY_OVERLAP_S
from tests.agent.driver import SMALL, AgentProcess, Driver, random_tokens, start_agents, stop_agents
from tests.support.processes import AGENT_KEY, PYTHON
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes

DATA_KEY = "epdk_test_" + secrets.token_urlsafe(16)
WRONG_KEY = "epak_wrong_" + secrets.token_urlsafe(16)
ENDED_KEY = "epak_ended_" + secrets.token_urlsafe(16)  # `guarded`'s previous key, its end already past
NO_GUESS_LIMIT = {"EPCTL_AGENT_AUTH_FAILURE_BURST": "0"}  # the matrix sends many wrong keys on purpose
GUESS_BURST = 10  # the agent's default
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
    guarded: AgentProcess  # the default guessing limit, and a previous key whose end has passed
    job_id: str
    generation: int
    guarded_key: str = AGENT_KEY  # its current key (the key-life test rotates it)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    workdir = Path(tmp_path_factory.mktemp("auth"))
    serving = start_agents(2, workdir, env={"EPCTL_AGENT_DATA_KEY": DATA_KEY, **NO_GUESS_LIMIT})
    others: list[AgentProcess] = []
    try:
        others += start_agents(1, workdir, prefix="p", extra_args=(), env=NO_GUESS_LIMIT)
        ended = {
            "EPCTL_AGENT_KEY_PREVIOUS": ENDED_KEY,
            "EPCTL_AGENT_KEY_PREVIOUS_UNTIL": str(time.time() - 1),
        }
        others += start_agents(1, workdir, prefix="g", extra_args=(), env=ended)
        driver = Driver()
        outcome = driver.reconfigure(serving)
        yield Plane(serving, others[0], others[1], outcome.job_id, driver.generation)
    finally:
        stop_agents([*serving, *others])


def call(
    agent: AgentProcess,
    key: str | None,
    method: str,
    path: str,
    body: object = None,
    *,
    source: str | None = None,
) -> httpx.Response:
    """One call; `source`: the client's own address (127.0.0.2 is another client on loopback)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    transport = httpx.HTTPTransport(local_address=source) if source else None
    with httpx.Client(base_url=agent.url, timeout=30, transport=transport) as http:
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
    # The first refusal of a spell names the call and the caller's address; the rest are summed up.
    log = target.log_path.read_text()
    assert re.search(r"refused (GET|POST) /v1/\S+ from 127\.0\.0\.1: (missing|wrong) control key", log), log
    for secret in (AGENT_KEY, DATA_KEY, WRONG_KEY):
        assert secret not in log


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
    answer = call(plane.production, AGENT_KEY, "POST", "/v1/faults", {"fail_next_switch": True})
    assert answer.status_code == 404 and answer.json()["code"] == "not-found", answer.text
    # A stranger learns no route: an unknown path needs the key like any other (401, not 404).
    anonymous = call(plane.production, None, "POST", "/v1/faults", {"fail_next_switch": True})
    assert anonymous.status_code == 401, anonymous.text
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


def test_a_previous_key_whose_end_has_passed_is_refused_on_every_route(plane: Plane) -> None:
    """EPCTL_AGENT_KEY_PREVIOUS comes with EPCTL_AGENT_KEY_PREVIOUS_UNTIL: past it, never accepted."""
    for method, path, body in harmful(plane)[:GUESS_BURST]:  # (each client address its own burst)
        answer = call(plane.guarded, ENDED_KEY, method, path, body, source="127.0.0.3")
        assert (answer.status_code, answer.json()["code"]) == (401, "agent-key-invalid"), (path, answer.text)
    for method, path, body in harmful(plane)[GUESS_BURST:]:
        answer = call(plane.guarded, ENDED_KEY, method, path, body, source="127.0.0.4")
        assert (answer.status_code, answer.json()["code"]) == (401, "agent-key-invalid"), (path, answer.text)
    assert call(plane.guarded, AGENT_KEY, "GET", "/v1/info").status_code == 200


def test_a_previous_key_works_until_its_overlap_ends_and_never_rotates(plane: Plane) -> None:
    agent = plane.guarded
    first, second = ("epak_next_" + secrets.token_urlsafe(16) for _ in range(2))
    too_short = call(agent, plane.guarded_key, "POST", "/v1/agent-key", {"key": first, "overlap_s": 0.001})
    assert too_short.status_code == 422, too_short.text  # an overlap has a minimum
    rotated = call(agent, plane.guarded_key, "POST", "/v1/agent-key", {"key": first, "overlap_s": 600})
    assert rotated.status_code == 200, rotated.text
    plane.guarded_key = first
    assert call(agent, AGENT_KEY, "GET", "/v1/info").status_code == 200  # within its overlap
    # The previous key cannot rotate, even inside its overlap: it cannot lock the coordinator out.
    hijack = call(agent, AGENT_KEY, "POST", "/v1/agent-key", {"key": WRONG_KEY, "overlap_s": 600})
    assert (hijack.status_code, hijack.json()["code"]) == (401, "agent-key-not-current"), hijack.text
    assert call(agent, first, "GET", "/v1/info").status_code == 200
    # A second rotation inside the first overlap: the key before ends at once, the one it replaces
    # lasts its own (short) overlap, then ends on every route.
    again = call(agent, first, "POST", "/v1/agent-key", {"key": second, "overlap_s": MIN_KEY_OVERLAP_S})
    assert again.status_code == 200, again.text
    plane.guarded_key = second
    ends_at = time.monotonic() + MIN_KEY_OVERLAP_S
    assert call(agent, AGENT_KEY, "GET", "/v1/info").status_code == 401
    assert call(agent, second, "GET", "/v1/info").status_code == 200
    assert call(agent, first, "GET", "/v1/info").status_code == 200 or time.monotonic() >= ends_at
    wait_until(lambda: time.monotonic() > ends_at + 0.5, timeout_s=MIN_KEY_OVERLAP_S + 5, what="the overlap")
    for index, (method, path, body) in enumerate(harmful(plane)):
        answer = call(agent, first, method, path, body, source=f"127.0.1.{index + 1}")
        assert answer.status_code == 401, f"{method} {path}: {answer.status_code} {answer.text}"
    assert call(agent, second, "GET", "/v1/info").status_code == 200


def test_guessing_is_throttled_in_a_few_log_lines_and_the_key_works_from_elsewhere(plane: Plane) -> None:
    agent, guesser = plane.guarded, "127.0.0.5"
    assert (
        call(agent, plane.guarded_key, "GET", "/v1/info", source=guesser).status_code == 200
    )  # proven there
    lines_before = len(agent.log_path.read_text().splitlines())
    statuses: list[int] = []
    sent_at: list[float] = []  # seconds since the first guess
    retry_after: set[str] = set()
    started = time.monotonic()
    transport = httpx.HTTPTransport(local_address=guesser)
    with httpx.Client(base_url=agent.url, timeout=30, transport=transport) as http:
        for _ in range(1000):
            wrong = "epak_guess_" + secrets.token_urlsafe(16)
            sent_at.append(time.monotonic() - started)
            answer = http.get("/v1/info", headers={"Authorization": f"Bearer {wrong}"})
            statuses.append(answer.status_code)
            if answer.status_code == 429:
                retry_after.add(answer.headers["retry-after"])
                assert answer.json()["code"] == "too-many-failed-attempts"
    elapsed = time.monotonic() - started
    assert set(statuses) == {401, 429}, set(statuses)
    # The burst, then one more failure per second (the refill) at most: counted against the clock, so
    # a slow machine (more refills) cannot make this fail, and a throttle that lets more through does.
    first_429 = statuses.index(429)
    assert statuses[:GUESS_BURST] == [401] * GUESS_BURST
    assert first_429 <= GUESS_BURST + int(sent_at[first_429]) + 1, (first_429, sent_at[first_429])
    assert statuses.count(401) <= GUESS_BURST + int(elapsed) + 1, (statuses.count(401), elapsed)
    assert retry_after and all(int(value) >= 1 for value in retry_after)
    grown = agent.log_path.read_text().splitlines()[lines_before:]
    assert len(grown) <= 4, grown
    # The real key still works: from another address, and from the guesser's, where it worked before.
    assert call(agent, plane.guarded_key, "GET", "/v1/info", source="127.0.0.2").status_code == 200
    assert call(agent, plane.guarded_key, "GET", "/v1/info", source=guesser).status_code == 200
    # A guess from elsewhere is still checked (401); from the guesser's address it waits (429: of a few
    # in a row at most one can find a failure regained since).
    assert call(agent, WRONG_KEY, "GET", "/v1/info", source="127.0.0.2").status_code == 401
    again = [call(agent, WRONG_KEY, "GET", "/v1/info", source=guesser).status_code for _ in range(3)]
    assert 429 in again and set(again) <= {401, 429}, again
    # What is open to anyone (inference without a data key) is never throttled: past the gate, this
    # idle engine answers 503 (no generation to serve), not 429.
    tokens = {"tokens": random_tokens(SMALL, 1).tolist()}
    assert call(agent, None, "POST", "/v1/infer", tokens, source=guesser).status_code == 503


BIG_BODY_BYTES = 200 * 1024 * 1024


def _send_big_body(url: str, path: str, result: dict[str, object]) -> None:
    """An anonymous JSON body of 200 MB, sent as fast as the agent takes it; records the status the
    agent answered and how many bytes it took before it did (by the socket's account)."""
    host, port = url.removeprefix("http://").split(":")
    chunk = b"[" + b"0," * (1024 * 1024 // 2 - 1) + b"0]"  # 1 MiB of valid-looking JSON
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BIG_BODY_BYTES}\r\n\r\n"
        )
        sock.sendall(head.encode())
        try:
            while sent < BIG_BODY_BYTES:
                sent += sock.send(chunk[: BIG_BODY_BYTES - sent])
        except OSError:
            pass  # the agent answered and closed the connection: the rest is never read
        answer = b""
        try:
            while b"\r\n" not in answer:
                part = sock.recv(4096)
                if not part:
                    break
                answer += part
        except OSError:
            pass
    result["sent"] = sent
    result["status"] = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else None


def _rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def test_anonymous_bodies_are_refused_before_they_are_read(plane: Plane) -> None:
    """The big-body probe: 4 x 200 MB anonymous bodies in parallel to a control route of a serving
    member; each refused (401) before it is read, the agent's peak memory within a few MB of idle,
    serving unaffected."""
    target = plane.serving[1]
    pid = target.process.pid
    with SteadyInfer(plane.serving[0]) as steady:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS (VmHWM) starts again from now
        time.sleep(1.0)
        idle_peak = _rss_kb(pid, "VmHWM")
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        results: list[dict[str, object]] = [{} for _ in range(4)]
        senders = [
            threading.Thread(target=_send_big_body, args=(target.url, "/v1/reconfig/prepare", r))
            for r in results
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=120)
        probe_peak = _rss_kb(pid, "VmHWM")
    assert [r["status"] for r in results] == [401] * 4, results
    # What the agent took before it answered: its socket buffers' worth, not the bodies.
    assert all(int(str(r["sent"])) < BIG_BODY_BYTES // 10 for r in results), results
    assert probe_peak - idle_peak < 8 * 1024, (idle_peak, probe_peak)
    assert steady.failed == [] and steady.ok > 0, steady.failed[:3]
    assert_serving_unchanged(plane)


def test_a_control_body_past_its_bound_is_refused_with_413(plane: Plane) -> None:
    big = {"job_id": plane.job_id, "pad": "x" * 100_000}
    answer = call(plane.serving[1], AGENT_KEY, "POST", "/v1/reconfig/pause", big)
    assert (answer.status_code, answer.json()["code"]) == (413, "body-too-large"), answer.text
    assert_serving_unchanged(plane)


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
