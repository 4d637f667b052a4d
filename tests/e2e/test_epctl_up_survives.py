"""`epctl up` survives signals, a second instance and its own crash (issue 11, phase 1).

Real processes: `epctl up` (coordinator + local reference agents) in its own session, signalled and
killed like an operator or the OOM killer would. Every test ends with no agent left running.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import torch

from app.launchers.local import PIDS_FILE
from engine_agent import moe
from engine_agent.protocol import EngineConfig
from tests.support.processes import Child, clean_environment, epctl_command, free_port, spawn
from tests.support.stack import SteadyClient
from tests.support.waiting import wait_until

# The demo deployment's engine (`epctl up` creates it with the default engine config).
DEMO_ENGINE = EngineConfig()
# How long the killed `epctl up` stays down before the restart. Engines serving through an absence
# longer than the old 15 s orphan grace is tests/e2e/test_engines_outlive_the_coordinator.py's (16 s, the
# same local launcher); here that `epctl up` opts its engines into no orphan watch is read from their
# command lines, and the adoption needs only some time down.
COORDINATOR_DOWN_S = 2.0


@dataclass
class Up:
    """One data directory and port that `epctl up` instances run on, one after another."""

    tmp: Path
    port: int
    env: dict[str, str]
    runs: int = 0
    started: list[Child] = field(default_factory=list)  # killed at the end, whatever a test did

    @property
    def data(self) -> Path:
        return self.tmp / "data"

    def start(self, *extra: str) -> Child:
        self.runs += 1
        argv = [*epctl_command(), "up", "--port", str(self.port), "--data-dir", str(self.data), *extra]
        child = spawn(
            f"epctl up #{self.runs}", argv, self.tmp / f"up-{self.runs}.log", env=self.env, cwd=self.tmp
        )
        self.started.append(child)
        return child

    def wait_welcome(self, up: Child) -> str:
        def welcome() -> str | None:
            text = up.log_path.read_text()
            return text if "export EPCTL_TOKEN=" in text else None

        return up.wait_for(welcome, timeout_s=120, what=f"{up.name} to print its welcome")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """An `epctl` command in this session's environment."""
        return subprocess.run(
            [*epctl_command(), *args], env=self.env, cwd=self.tmp, capture_output=True, text=True, timeout=60
        )

    def steady_client(self) -> SteadyClient:
        """A steady client on every serving engine of the demo deployment."""
        urls = [entry["url"] for entry in json.loads((self.data / PIDS_FILE).read_text()).values()]
        tokens = torch.randn(4, DEMO_ENGINE.hidden_size, generator=torch.Generator().manual_seed(3))
        expected = moe.reference_forward(DEMO_ENGINE, tokens).tolist()
        return SteadyClient(urls, tokens.tolist(), expected, streams=2, period_s=0.02).start()

    def pids(self) -> list[int]:
        records = json.loads((self.data / PIDS_FILE).read_text())
        return sorted(int(entry["pid"]) for entry in records.values())

    def deployment(self) -> dict[str, object]:
        token = (self.data / "admin-token").read_text().strip()
        response = httpx.get(
            f"http://127.0.0.1:{self.port}/v1/deployments/demo", headers={"Authorization": f"Bearer {token}"}
        )
        response.raise_for_status()
        return dict(response.json())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], timeout_s: float = 60) -> None:
    wait_until(
        lambda: not any(_alive(pid) for pid in pids),
        timeout_s=timeout_s,
        what=f"agents {pids} to exit",
        interval_s=0.1,
    )


@pytest.fixture
def up_env(tmp_path: Path) -> Iterator[Up]:
    env = clean_environment({"EPCTL_RUNNER_LOCAL_AGENT_ARGS": "--heartbeat-s 1"})
    session = Up(tmp_path, free_port(), env)
    try:
        yield session
    finally:
        for child in session.started:  # a test that failed half-way must not leave `epctl up` running
            child.kill()
        with_records = (session.data / PIDS_FILE).exists()
        for pid in session.pids() if with_records else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_every_engine_and_a_second_epctl_up_refuses_touching_nothing(up_env: Up) -> None:
    first = up_env.start()
    try:
        up_env.wait_welcome(first)
        pids = up_env.pids()
        assert len(pids) == 2
        database = up_env.data / "epctl.db"
        before = up_env.deployment()

        second = up_env.start()
        assert second.popen.wait(timeout=60) == 1
        refusal = second.log_path.read_text().strip().splitlines()
        # Its port is the first thing it finds taken (checked before the data directory's lock).
        assert len(refusal) == 1 and "address already in use" in refusal[0], refusal
        assert all(_alive(pid) for pid in pids) and up_env.pids() == pids
        after = up_env.deployment()
        assert (after["current_dp_size"], after["generation"], after["updated_at"]) == (
            before["current_dp_size"],
            before["generation"],
            before["updated_at"],
        )
        assert database.exists()

        first.popen.send_signal(signal.SIGTERM)
        assert first.popen.wait(timeout=60) == 0, first.log_tail()
        assert "stopped 2 agent(s)" in first.log_path.read_text()
        _wait_gone(pids, timeout_s=5)
        assert json.loads((up_env.data / PIDS_FILE).read_text()) == {}
    finally:
        first.kill()


def test_a_restarted_epctl_up_adopts_the_running_deployment_as_it_is_and_sighup_stops_it(up_env: Up) -> None:
    """Killed, and started again a little later: its engines watch no parent (no orphan exit unless opted
    in), a steady client saw no failed request, the same processes serve, and the new run says `adopted`
    (it asked every member)."""
    first = up_env.start("--engines", "3")
    up_env.wait_welcome(first)
    pids = up_env.pids()
    assert len(pids) == 3 and up_env.deployment()["current_dp_size"] == 3
    for pid in pids:  # no `--parent-pid`/`--orphan-grace-s`: they serve however long it is gone
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"--parent-pid" not in argv and b"--orphan-grace-s" not in argv, argv
    client = up_env.steady_client()
    client.wait_serving()
    first.kill()  # SIGKILL: nothing of `epctl up` runs; the engines serve on
    time.sleep(COORDINATOR_DOWN_S)
    second = up_env.start()  # the default would be 2 engines: an adopted deployment is never rescaled
    try:
        output = up_env.wait_welcome(second)
        assert "adopted deployment demo as it runs: 3 engines" in output, output
        client.wait_serving()
        failed = [s for s in client.stop() if not s.ok]
        assert failed == [], [s.error for s in failed][:3]
        assert up_env.pids() == pids and all(_alive(pid) for pid in pids)
        deployment = up_env.deployment()
        assert deployment["current_dp_size"] == 3 and deployment["active_job_id"] is None

        second.popen.send_signal(signal.SIGHUP)
        assert second.popen.wait(timeout=60) == 0, second.log_tail()
        _wait_gone(pids, timeout_s=5)
    finally:
        client.stop()
        second.kill()


def test_an_engine_lost_while_epctl_up_was_down_is_reported_and_healed(up_env: Up) -> None:
    first = up_env.start("--engines", "2")
    up_env.wait_welcome(first)
    records = json.loads((up_env.data / PIDS_FILE).read_text())
    lost_id, lost = sorted(records.items())[1]
    first.kill()
    os.kill(int(lost["pid"]), signal.SIGKILL)
    second = up_env.start()
    try:
        output = up_env.wait_welcome(second)
        assert "adopted" not in output, output
        assert "deployment demo is not whole" in output and f"gone: {lost_id}" in output, output
        assert "whole again" in output, output
        # "whole again" is printed once the deployment serves at its size; the heal job records its end
        # just after, so the record is read until it does.
        wait_until(
            lambda: (lambda d: (d["status"], d["active_job_id"]) == ("ready", None))(up_env.deployment()),
            timeout_s=60,
            what="the deployment ready with no job running",
            describe=lambda: str(up_env.deployment()),
        )
        second.popen.send_signal(signal.SIGTERM)
        assert second.popen.wait(timeout=60) == 0, second.log_tail()
    finally:
        second.kill()


def test_epctl_down_stops_the_engines_a_killed_epctl_up_left_serving(up_env: Up) -> None:
    first = up_env.start("--engines", "1")
    up_env.wait_welcome(first)
    (pid,) = up_env.pids()
    first.kill()
    assert _alive(pid)  # serving on, with no coordinator
    down = up_env.run("down", "--data-dir", str(up_env.data))
    assert down.returncode == 0, down.stderr
    assert f"(pid {pid})" in down.stdout and "stopped agent demo-" in down.stdout, down.stdout
    _wait_gone([pid], timeout_s=10)
    with sqlite3.connect(up_env.data / "epctl.db") as db:
        assert db.execute("select current_dp_size from deployments where name = 'demo'").fetchone() == (0,)
    again = up_env.run("down", "--data-dir", str(up_env.data))
    assert again.returncode == 0 and "nothing recorded" in again.stdout, again.stdout


def test_with_the_opt_in_orphan_exit_engines_of_a_killed_epctl_up_exit(up_env: Up) -> None:
    """Off by default (serving never depends on a coordinator); for throwaway machines only."""
    up_env.env["EPCTL_RUNNER_LOCAL_AGENT_ORPHAN_GRACE_S"] = "2"
    first = up_env.start("--engines", "1")
    up_env.wait_welcome(first)
    pids = up_env.pids()
    first.kill()
    _wait_gone(pids, timeout_s=60)

    # The next `epctl up` finds the previous run's engines gone and starts the deployment again, at the
    # size it had (not the default of 2).
    second = up_env.start()
    try:
        output = up_env.wait_welcome(second)
        assert "engines of the previous run are gone" in output and "back at 1 engines" in output, output
        assert up_env.deployment()["current_dp_size"] == 1
        second.popen.send_signal(signal.SIGINT)
        assert second.popen.wait(timeout=60) == 0
    finally:
        second.kill()
    with sqlite3.connect(up_env.data / "epctl.db") as db:
        assert db.execute(
            "select current_dp_size, status, stopped_dp_size from deployments where name = 'demo'"
        ).fetchone() == (0, "stopped", 1)


def test_a_restarted_epctl_up_ends_the_job_its_crash_stranded_and_keeps_the_deployment_serving(
    up_env: Up,
) -> None:
    """`epctl up` killed while a shrink 4 -> 3 is in prepare (held there by a test-only fault switch):
    the next run reconciles the stranded job at once (the same coordinator name claims its own jobs; no
    30 s lease to wait out), and adopts the 4 engines still serving, never exiting or rescaling."""
    up_env.env["EPCTL_RUNNER_LOCAL_AGENT_ARGS"] = "--heartbeat-s 1 --enable-fault-injection"
    # A lease far longer than the welcome wait: a restart that waited it out would fail this test.
    up_env.env["EPCTL_JOB_LEASE_S"] = "600"
    first = up_env.start("--engines", "4")
    up_env.wait_welcome(first)
    pids = up_env.pids()
    assert len(pids) == 4
    token = (up_env.data / "admin-token").read_text().strip()
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{up_env.port}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    key = api.post("/v1/deployments/demo/agent-key").json()["key"]  # `epctl up` made it: shown once
    agents = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=5)
    for engine in api.get("/v1/engines", params={"deployment": "demo", "state": "serving"}).json()["data"]:
        agents.post(f"{engine['url']}/v1/faults", json={"hang_prepare_at_step": "agree"}).raise_for_status()
    created = api.post("/v1/reconfigurations", json={"deployment": "demo", "target_dp_size": 3})
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    wait_until(
        lambda: api.get(f"/v1/reconfigurations/{job_id}").json()["state"] == "preparing",
        timeout_s=60,
        what=f"job {job_id} to be preparing",
    )
    first.kill()  # SIGKILL inside prepare: the job is stranded, the agents wait to be adopted

    second = up_env.start()
    try:
        output = up_env.wait_welcome(second)
        assert "adopted deployment demo as it runs: 4 engines" in output, output
        # Ended before the welcome (whether `epctl up` saw it active or the runner was quicker).
        job = api.get(f"/v1/reconfigurations/{job_id}").json()
        assert job["state"] == "rolled_back", job
        assert job["error"]["type"] == "coordinator-restarted", job["error"]
        deployment = up_env.deployment()
        assert (deployment["current_dp_size"], deployment["status"]) == (4, "ready"), deployment
        assert up_env.pids() == pids and all(_alive(pid) for pid in pids)

        second.popen.send_signal(signal.SIGTERM)
        assert second.popen.wait(timeout=60) == 0, second.log_tail()
        _wait_gone(pids, timeout_s=5)
    finally:
        api.close()
        second.kill()
        first.kill()


def test_sigint_during_a_self_heal_job_ends_it_and_a_restart_comes_back_at_the_size_it_had(
    up_env: Up,
) -> None:
    """Issue 34: `epctl up` at 3 engines loses one; its self-heal job (a shrink to the 2 survivors, then a
    grow-back to 3) is held in prepare by a test-only fault switch when SIGINT arrives. The stop ends the
    job (nothing is left `preparing` until the next start) and records the deployment `stopped` at 3;
    the next `epctl up` brings it back at 3 (not the default 2), with no job open."""
    up_env.env["EPCTL_RUNNER_LOCAL_AGENT_ARGS"] = "--heartbeat-s 1 --enable-fault-injection"
    first = up_env.start("--engines", "3")
    up_env.wait_welcome(first)
    token = (up_env.data / "admin-token").read_text().strip()
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{up_env.port}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    try:
        key = api.post("/v1/deployments/demo/agent-key").json()["key"]
        agents = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=5)
        serving = api.get("/v1/engines", params={"deployment": "demo", "state": "serving"}).json()["data"]
        lost, survivors = serving[-1], serving[:-1]
        for engine in survivors:
            agents.post(
                f"{engine['url']}/v1/faults", json={"hang_prepare_at_step": "agree"}
            ).raise_for_status()
        os.kill(int(lost["pid"]), signal.SIGKILL)

        def healing() -> dict[str, object] | None:
            jobs = api.get("/v1/reconfigurations", params={"deployment": "demo", "limit": 1}).json()["data"]
            job = jobs[0] if jobs else None
            held = job and job["requested_by"] == "self-heal" and job["progress"]["step"] == "preparing"
            return job if held else None

        job = wait_until(healing, timeout_s=60, what="a self-heal job held in prepare")
        first.popen.send_signal(signal.SIGINT)
        assert first.popen.wait(timeout=90) == 0, first.log_tail()
        with sqlite3.connect(up_env.data / "epctl.db") as db:
            assert db.execute("select state from reconfigurations where id = ?", (job["id"],)).fetchone() == (
                "cancelled",
            )
            # Ended by the stopping coordinator itself (its agents told to abort), not only on the record.
            asked = db.execute(
                "select count(*) from job_events where job_id = ? "
                "and message like '%the coordinator stopping%'",
                (job["id"],),
            ).fetchone()
            assert asked == (1,), asked
            assert db.execute(
                "select count(*) from reconfigurations where state not in "
                "('succeeded', 'failed', 'rolled_back', 'cancelled')"
            ).fetchone() == (0,)
            assert db.execute(
                "select current_dp_size, status, stopped_dp_size from deployments where name = 'demo'"
            ).fetchone() == (0, "stopped", 3)

        second = up_env.start()
        try:
            output = up_env.wait_welcome(second)
            assert "back at 3 engines" in output, output
            deployment = up_env.deployment()
            assert (deployment["current_dp_size"], deployment["status"], deployment["active_job_id"]) == (
                3,
                "ready",
                None,
            ), deployment
            second.popen.send_signal(signal.SIGTERM)
            assert second.popen.wait(timeout=60) == 0, second.log_tail()
        finally:
            second.kill()
    finally:
        api.close()
        first.kill()
