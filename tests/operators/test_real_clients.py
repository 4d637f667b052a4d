"""The coordinator against the clients operators run: Debian's Alertmanager (0.25) and Prometheus (2.42),
started by the test from the packages `scripts/prometheus-tools` installs (skipped, saying why, where
they are absent).

- An alert fired at Alertmanager reaches `/v1/hooks/alertmanager` and scales; a second one refused for
  the cooldown is deferred and acted on when the cooldown ends, without a repeat from Alertmanager; an
  alert naming an unknown deployment shows as a 4xx in Alertmanager's own log.
- Prometheus, configured with the docs' own scrape config (`docs/api.md`), scrapes the coordinator and
  discovers the agents through `/v1/sd/agents`.
- The docs' receiver config (`docs/operations/webhooks-and-autoscalers.md`) is one Alertmanager accepts
  (`amtool check-config`), and its scrape config one Prometheus accepts (`promtool check config`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from sqlmodel import Session, select

from app.core.db import make_engine
from app.deployments.models import Deployment
from tests.support.monitoring import (
    ALERTMANAGER,
    PROMETHEUS,
    Monitor,
    active_targets,
    fire,
    missing,
    prometheus_query,
    resolve,
)
from tests.support.processes import ROOT, Coordinator
from tests.support.waiting import wait_until

COOLDOWN_S = 4.0


def alertmanager_config(coordinator: Coordinator, token_file: Path, repeat_interval: str = "4h") -> str:
    # group_by as the docs advise; by default repeat_interval far beyond the test: a deferred request
    # must be acted on without a repeat.
    return f"""
route:
  receiver: epctl
  group_by: [alertname, deployment]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: {repeat_interval}
receivers:
  - name: epctl
    webhook_configs:
      - url: {coordinator.url}/v1/hooks/alertmanager
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials_file: {token_file}
"""


def static_deployment(
    admin: httpx.Client,
    name: str,
    *,
    cooldown_s: float = 0.0,
    behavior: dict[str, Any] | None = None,
    database_url: str | None = None,
) -> None:
    """A static deployment with four registered engines nobody answers for: jobs roll back at once,
    which is all these tests need (a job is the decision). With `database_url`, its record says it
    serves at DP size 2 (no engine heartbeats, so nothing else would)."""
    body: dict[str, Any] = {
        "name": name,
        "launcher": "static",
        "max_dp_size": 4,
        "autoscale_cooldown_s": cooldown_s,
        "on_engine_loss": "none",
    }
    if behavior is not None:
        body["autoscale_behavior"] = behavior
    admin.post("/v1/deployments", json=body).raise_for_status()
    if database_url is not None:
        database = make_engine(database_url)
        try:
            with Session(database) as session:
                row = session.exec(select(Deployment).where(Deployment.name == name)).one()
                row.current_dp_size = 2
                session.add(row)
                session.commit()
        finally:
            database.dispose()
    for index in range(4):
        engine = {
            "engine_id": f"{name}-e{index}",
            "deployment": name,
            "url": "http://127.0.0.1:9",
            "platform": "cpu",
            "device": "cpu",
            "engine": {},
        }
        admin.post("/v1/engines", json=engine).raise_for_status()


def jobs_of(admin: httpx.Client, deployment: str) -> list[dict[str, Any]]:
    listed = admin.get("/v1/reconfigurations", params={"deployment": deployment, "limit": 50}).json()
    return sorted(listed["data"], key=lambda job: job["created_at"])


def hook_requests(admin: httpx.Client, deployment: str) -> list[dict[str, Any]]:
    listed = admin.get("/v1/hooks/requests", params={"deployment": deployment, "limit": 500})
    return list(listed.json()["data"])


@pytest.fixture
def coordinator(database_url: str, tmp_path: Path) -> Iterator[Coordinator]:
    env = {
        "EPCTL_RUNNER_ENABLED": "true",
        "EPCTL_RUNNER_DESIRED_SIZE_INTERVAL_S": "0.2",
        "EPCTL_HEARTBEAT_TIMEOUT_S": "3600",  # the registered engines never heartbeat
        "EPCTL_WEBHOOK_WORKER_ENABLED": "false",
    }
    with Coordinator(database_url, tmp_path / "coordinator", env=env) as live:
        yield live


@pytest.mark.skipif(bool(missing(ALERTMANAGER)), reason=missing(ALERTMANAGER) or "")
def test_alertmanager_scales_defers_through_the_cooldown_and_sees_4xx_for_an_unknown_deployment(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    admin = coordinator.api
    static_deployment(admin, "d1", cooldown_s=COOLDOWN_S)
    token = admin.post("/v1/tokens", json={"name": "alertmanager", "role": "autoscaler"}).json()["token"]
    token_file = tmp_path / "epctl-autoscaler.token"
    token_file.write_text(token)
    with Monitor(ALERTMANAGER, alertmanager_config(coordinator, token_file), tmp_path / "am") as alertmanager:
        describe = lambda: coordinator.log_tail() + alertmanager.log()[-4000:]  # noqa: E731

        # 1. A firing alert scales the deployment it names.
        fire(alertmanager, {"alertname": "MoEQueueLong", "deployment": "d1", "target_dp_size": "2"})
        [first] = wait_until(
            lambda: jobs_of(admin, "d1"), timeout_s=60, what="a job from the alert", describe=describe
        )
        assert (first["to_dp_size"], first["requested_by"], first["requester"]) == (
            2,
            "autoscaler",
            "alertmanager",
        )
        coordinator.wait_job(first["id"])

        # 2. Another group's alert inside the cooldown is deferred, then acted on after it, unrepeated.
        fire(alertmanager, {"alertname": "MoEBacklog", "deployment": "d1", "target_dp_size": "3"})
        deferred = wait_until(
            lambda: [r for r in hook_requests(admin, "d1") if r["decision"] == "deferred"],
            timeout_s=60,
            what="the second alert to be deferred for the cooldown",
            describe=describe,
        )
        assert deferred[0]["details"]["code"] == "cooldown"
        desired = admin.get("/v1/deployments/d1").json()["desired"]
        assert (desired["dp_size"], desired["source"], desired["pending"]) == (3, "alertmanager", True)
        second = wait_until(
            lambda: jobs_of(admin, "d1")[1:],
            timeout_s=60,
            what="the reconciler to act on the deferred alert after the cooldown",
            describe=describe,
        )[0]
        assert (second["to_dp_size"], second["requested_by"]) == (3, "autoscaler")
        asked = [r for r in hook_requests(admin, "d1") if (r["details"] or {}).get("origin") != "coordinator"]
        assert len(asked) == 2, "Alertmanager sent each group once: nothing was repeated"
        later = [r for r in hook_requests(admin, "d1") if (r["details"] or {}).get("origin") == "coordinator"]
        [acted] = [r for r in later if r["code"] == "scaling"]
        assert (acted["intent_id"], acted["job_id"]) == (deferred[0]["intent_id"], second["id"])
        # The first job rolled back (nobody answers for these engines): its move is retried after a backoff,
        # each attempt on a record (and each change of what holds it back since, on one too).
        assert [r["job_id"] for r in later if r["code"] == "retrying"][:1] == [first["id"]]

        # 3. An unknown deployment is a 4xx that Alertmanager logs (and does not retry).
        fire(alertmanager, {"alertname": "MoEQueueLong", "deployment": "ghost", "step": "+1"})
        wait_until(
            lambda: re.search(r"unexpected status code 404", alertmanager.log()),
            timeout_s=60,
            what="Alertmanager to log the 404",
            describe=describe,
        )
        assert "unknown-deployment" in alertmanager.log()


def by_the_coordinator(record: dict[str, Any]) -> bool:
    """A record the coordinator wrote when it acted on an intent later (not a request)."""
    return bool((record["details"] or {}).get("origin") == "coordinator")


def autoscaler_jobs(admin: httpx.Client, deployment: str) -> list[dict[str, Any]]:
    return [job for job in jobs_of(admin, deployment) if job["requested_by"] == "autoscaler"]


def duplicates_of(admin: httpx.Client, deployment: str, alertname: str) -> list[dict[str, Any]]:
    """The repeats of the alert's first notification (records linked to the decision they repeat)."""
    first = first_ask(admin, deployment, alertname)
    return [r for r in hook_requests(admin, deployment) if first and r["duplicate_of"] == first["id"]]


def first_ask(admin: httpx.Client, deployment: str, alertname: str) -> dict[str, Any] | None:
    """The record that decided the alert's first notification (None before it arrived)."""
    found = [
        r
        for r in hook_requests(admin, deployment)
        if alertname in r["reason"]
        and r["duplicate_of"] is None
        and r["intent_id"]
        and not by_the_coordinator(r)
        and r["code"] != "resolved"
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.mark.skipif(bool(missing(ALERTMANAGER)), reason=missing(ALERTMANAGER) or "")
def test_a_real_alertmanager_repeating_resolving_and_competing_never_flaps_a_deployment(
    coordinator: Coordinator, database_url: str, tmp_path: Path
) -> None:
    """Issue 26 with Debian's Alertmanager resending every group every ~2 s, four deployments at once:
    steady (a long-firing step alert scales once), resolved and its control (an alert resolved before
    its deferred intent runs leaves the deployment; the same alert left firing is acted on after the
    cooldown), opposite (two groups asking for opposite sizes move it at most once per window, counted
    over several windows), operator (an operator's scale is never undone by a repeat)."""
    admin = coordinator.api
    for name in ("steady", "operator"):
        static_deployment(admin, name, database_url=database_url)
    for name in ("resolved", "control"):
        static_deployment(admin, name, cooldown_s=COOLDOWN_S * 3, database_url=database_url)
    window = {"scale_down": {"stabilization_window_s": COOLDOWN_S}}
    static_deployment(admin, "opposite", behavior=window, database_url=database_url)
    token = admin.post("/v1/tokens", json={"name": "alertmanager", "role": "autoscaler"}).json()["token"]
    token_file = tmp_path / "epctl-autoscaler.token"
    token_file.write_text(token)
    config = alertmanager_config(coordinator, token_file, repeat_interval="2s")
    with Monitor(ALERTMANAGER, config, tmp_path / "am") as alertmanager:
        describe = lambda: coordinator.log_tail() + alertmanager.log()[-4000:]  # noqa: E731

        # The cooldown of `resolved`, then of `control`, runs from an operator's job (it rolls back).
        for name in ("resolved", "control"):
            job = admin.post("/v1/reconfigurations", json={"deployment": name, "target_dp_size": 3}).json()
            coordinator.wait_job(job["id"])
        burst = {"alertname": "Burst", "target_dp_size": "4"}
        for name in ("resolved", "control"):
            fire(alertmanager, {**burst, "deployment": name})
        fire(alertmanager, {"alertname": "Steady", "deployment": "steady", "step": "+1"})
        fire(alertmanager, {"alertname": "Busy", "deployment": "opposite", "target_dp_size": "4"})
        fire(alertmanager, {"alertname": "Idle", "deployment": "opposite", "target_dp_size": "1"})
        fire(alertmanager, {"alertname": "Busy", "deployment": "operator", "target_dp_size": "4"})

        # resolved: withdrawn before the cooldown ends; control: acted on after it.
        deferred = wait_until(
            lambda: [r for r in hook_requests(admin, "resolved") if r["code"] == "cooldown"],
            timeout_s=60,
            what="the Burst alert to be deferred for the cooldown",
            describe=describe,
        )
        resolve(alertmanager, {**burst, "deployment": "resolved"})
        [withdrawn] = wait_until(
            lambda: [r for r in hook_requests(admin, "resolved") if r["decision"] == "withdrawn"],
            timeout_s=60,
            what="Alertmanager's resolved notification to withdraw the deferred intent",
            describe=describe,
        )
        assert withdrawn["intent_id"] == deferred[0]["intent_id"]
        [acted] = wait_until(
            lambda: autoscaler_jobs(admin, "control"),
            timeout_s=60,
            what="the control's deferred intent to be acted on after its cooldown",
            describe=describe,
        )
        # `control`'s cooldown ended after `resolved`'s: the reconciler has passed `resolved` since.
        assert autoscaler_jobs(admin, "resolved") == [], "a withdrawn intent was acted on"

        # operator: the Busy alert scaled once, the operator scaled, Busy keeps repeating.
        [busy_job] = wait_until(
            lambda: autoscaler_jobs(admin, "operator"), timeout_s=60, what="Busy's job", describe=describe
        )
        coordinator.wait_job(busy_job["id"])
        operator_job = admin.post(
            "/v1/reconfigurations", json={"deployment": "operator", "target_dp_size": 3}
        ).json()
        coordinator.wait_job(operator_job["id"])
        seen = len(duplicates_of(admin, "operator", "Busy"))
        wait_until(
            lambda: len(duplicates_of(admin, "operator", "Busy")) >= seen + 3,
            timeout_s=60,
            what="three more repeats of Busy after the operator's scale",
            describe=describe,
        )

        # opposite: count over several windows of repeats.
        idle = wait_until(lambda: first_ask(admin, "opposite", "Idle"), timeout_s=60, what="Idle's first ask")
        later = _plus(idle["created_at"], 4 * COOLDOWN_S)
        wait_until(
            lambda: any(r["created_at"] > later for r in duplicates_of(admin, "opposite", "Idle")),
            timeout_s=90,
            what="four scale-down windows of Idle repeats",
            describe=describe,
        )
        # steady: many repeats of one firing alert.
        wait_until(
            lambda: len(duplicates_of(admin, "steady", "Steady")) >= 5,
            timeout_s=60,
            what="five repeats of the steady alert",
            describe=describe,
        )

    steady = first_ask(admin, "steady", "Steady")
    assert steady is not None
    # Its job rolls back (nobody answers for these engines) and is retried with backoff (issue 36): every
    # job is a retry of the one move, each on a record, never a second step.
    steady_jobs = autoscaler_jobs(admin, "steady")
    assert {j["to_dp_size"] for j in steady_jobs} == {3}, "a steady step alert scales once"
    retried = [r for r in hook_requests(admin, "steady") if r["code"] == "retrying"]
    assert len(steady_jobs) - 1 <= len(retried) <= len(steady_jobs)
    assert {r["duplicate_of"] for r in duplicates_of(admin, "steady", "Steady")} == {steady["id"]}
    opposite = autoscaler_jobs(admin, "opposite")  # one move, retried while it rolls back (issue 36)
    assert {j["to_dp_size"] for j in opposite} == {4}, "two opposite groups flapped the deployment"
    assert [j["id"] for j in autoscaler_jobs(admin, "operator")] == [busy_job["id"]], (
        "a repeat undid the operator"
    )
    assert acted["to_dp_size"] == 4


def _plus(stamp: str, seconds: float) -> str:
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00")) + timedelta(seconds=seconds)
    return moment.isoformat().replace("+00:00", "Z")


@pytest.mark.skipif(shutil.which("amtool") is None, reason=missing("amtool") or "")
@pytest.mark.processes
def test_the_readmes_alertmanager_config_is_valid(tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "operations" / "webhooks-and-autoscalers.md").read_text()
    block = re.search(r"```yaml\n(  route:.*?receivers:.*?)```", guide, re.S)
    assert block is not None, "the autoscalers guide shows an Alertmanager receiver config"
    token_file = tmp_path / "token"
    token_file.write_text("secret")
    config = "\n".join(line[2:] for line in block.group(1).splitlines())
    config = config.replace("/etc/alertmanager/epctl-autoscaler.token", str(token_file))
    (tmp_path / "alertmanager.yml").write_text(config)
    done = subprocess.run(
        ["amtool", "check-config", str(tmp_path / "alertmanager.yml")],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


@contextmanager
def fake_agent() -> Iterator[str]:
    """An HTTP server answering `/metrics` with the agent's own exposition (its real `AgentMetrics`)."""
    from engine_agent.agent import AgentMetrics

    counters = SimpleNamespace(steps=10, dummy_steps=2, requests_served=5, tokens_served=80, pauses=1)
    agent_metrics = AgentMetrics(SimpleNamespace(counters=counters))  # type: ignore[arg-type]
    agent_metrics.pause_seconds.observe(0.0123)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(agent_metrics.registry) if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def readme_prometheus_config(coordinator: Coordinator, token_file: Path) -> str:
    """The docs' scrape config, pointed at this coordinator and token, on a test's short intervals."""
    block = re.search(r"```yaml\n(scrape_configs:.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)
    assert block is not None, "the API guide shows a Prometheus scrape config"
    config = (
        block.group(1)
        .replace("http://coordinator:8000", coordinator.url)
        .replace("coordinator:8000", f"127.0.0.1:{coordinator.port}")
        .replace("/etc/prometheus/epctl-viewer.token", str(token_file))
        .replace("refresh_interval: 30s", "refresh_interval: 1s")
    )
    assert "coordinator:8000" not in config and "/etc/" not in config, config
    return "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n" + config


@pytest.mark.skipif(shutil.which("promtool") is None, reason=missing("promtool") or "")
@pytest.mark.processes
def test_the_readmes_prometheus_config_is_valid(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("secret")
    coordinator = SimpleNamespace(url="http://127.0.0.1:8000", port=8000)
    (tmp_path / "prometheus.yml").write_text(readme_prometheus_config(coordinator, token_file))  # type: ignore[arg-type]
    done = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


@pytest.mark.skipif(bool(missing(PROMETHEUS)), reason=missing(PROMETHEUS) or "")
@pytest.mark.processes
def test_prometheus_scrapes_the_coordinator_and_discovers_agents(database_url: str, tmp_path: Path) -> None:
    with Coordinator(database_url, tmp_path / "coordinator") as coordinator, fake_agent() as agent_url:
        admin = coordinator.api
        admin.post("/v1/deployments", json={"name": "d1", "launcher": "static"}).raise_for_status()
        engine: dict[str, Any] = {"engine_id": "d1-e0", "deployment": "d1", "url": agent_url, "engine": {}}
        engine.update(platform="cpu", device="cpu")
        admin.post("/v1/engines", json=engine).raise_for_status()
        heartbeat = {"state": "serving", "generation": 1, "rank": 0, "world_size": 1}
        admin.post("/v1/engines/d1-e0/heartbeat", json=heartbeat).raise_for_status()
        token = admin.post("/v1/tokens", json={"name": "prometheus", "role": "viewer"}).json()["token"]
        token_file = tmp_path / "epctl-viewer.token"
        token_file.write_text(token)

        config = readme_prometheus_config(coordinator, token_file)
        with Monitor(PROMETHEUS, config, tmp_path / "prom") as prometheus:

            def agent_target() -> dict[str, Any] | None:
                for target in active_targets(prometheus):
                    if target["labels"].get("job") == "epctl-agents" and target["health"] == "up":
                        return target
                return None

            target = wait_until(
                agent_target,
                timeout_s=90,
                what="Prometheus to discover and scrape the agent",
                describe=prometheus.log,
            )
            assert target["labels"]["deployment"] == "d1" and target["labels"]["engine_id"] == "d1-e0"
            assert target["scrapeUrl"] == f"{agent_url}/metrics"
            [pauses] = wait_until(
                lambda: prometheus_query(prometheus, 'epctl_agent_pause_seconds_count{deployment="d1"}'),
                timeout_s=60,
                what="the agent's pause histogram in Prometheus",
            )
            assert pauses["metric"]["engine_id"] == "d1-e0"
            [size] = wait_until(
                lambda: prometheus_query(
                    prometheus, 'epctl_deployment_engines{job="epctl",deployment="d1",state="serving"}'
                ),
                timeout_s=60,
                what="the coordinator's deployment gauges in Prometheus",
            )
            assert size["value"][1] == "1"

            admin.delete("/v1/engines/d1-e0").raise_for_status()  # the engine left: its target goes
            wait_until(
                lambda: (
                    agent_target() is None
                    and not any(t["labels"].get("job") == "epctl-agents" for t in active_targets(prometheus))
                ),
                timeout_s=60,
                what="Prometheus to drop the target of the engine that left",
            )
