"""TLS where traffic crosses machines: a coordinator and its agents on HTTPS with a CA made here, a
2 -> 3 -> 2 cycle over it; an agent whose certificate another CA signed is refused by the coordinator,
and a coordinator another CA signed is refused by an agent."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engine_agent.engine_options import engine_args
from tests.support.agent_zygote import Zygote
from tests.support.certs import TestCA
from tests.support.processes import AGENT_KEY, start_agents
from tests.support.stack import ENGINE, StackCoordinator
from tests.support.waiting import wait_until


@dataclass
class TlsCoordinator(StackCoordinator):
    """The e2e coordinator, served over HTTPS and checked against `ca_file`."""

    ca_file: Path | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _verify(self) -> ssl.SSLContext:
        assert self.ca_file is not None
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _wait_ready(self, child: object, timeout_s: float) -> None:
        verify = self._verify()

        def ready() -> bool:
            return httpx.get(f"{self.url}/readyz", timeout=2.0, verify=verify).status_code == 200

        assert self.child is not None
        self.child.wait_for(ready, timeout_s=timeout_s, what=f"the coordinator on {self.url} to be ready")

    def client(self, token: str | None = None, timeout_s: float = 10.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, verify=self._verify())


@dataclass
class Cluster:
    coordinator: TlsCoordinator
    ca: TestCA
    other: TestCA
    tmp: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("tls")
    ca, other = TestCA(tmp / "pki", "ours"), TestCA(tmp / "pki", "theirs")
    coordinator_files, agent_files = ca.server("coordinator"), ca.server("agents")
    env = {
        "EPCTL_TLS_CERT_FILE": str(coordinator_files.cert),
        "EPCTL_TLS_KEY_FILE": str(coordinator_files.key),
        "EPCTL_AGENT_CA_FILE": str(ca.ca_file),
        # Passed on to the agents the local launcher starts (their environment is the coordinator's).
        "EPCTL_AGENT_TLS_CERT_FILE": str(agent_files.cert),
        "EPCTL_AGENT_TLS_KEY_FILE": str(agent_files.key),
        "EPCTL_AGENT_TLS_CA_FILE": str(ca.ca_file),
    }
    database = f"sqlite:///{tmp / 'epctl.db'}"
    coordinator = TlsCoordinator(database, tmp / "data", env=env, command="serve", ca_file=ca.ca_file)
    try:
        coordinator.start()
        yield Cluster(coordinator, ca, other, tmp)
    finally:
        coordinator.close()


def test_a_2_3_2_cycle_runs_over_https_against_the_operators_ca(cluster: Cluster) -> None:
    coordinator = cluster.coordinator
    coordinator.create_deployment("demo")
    verify = ssl.create_default_context(cafile=str(cluster.ca.ca_file))
    for target in (2, 3, 2):
        job = coordinator.wait_job(coordinator.scale(target))
        assert job["state"] == "succeeded", job
        serving = [e for e in coordinator.engines() if e["state"] == "serving"]
        assert len(serving) == target
        for engine in serving:
            assert engine["url"].startswith("https://127.0.0.1:"), engine
            answer = httpx.post(
                f"{engine['url']}/v1/infer", json={"tokens": [[0.5] * ENGINE.hidden_size]}, verify=verify
            )
            assert answer.status_code == 200, answer.text
    # The agents speak TLS only, and a client without the operator's CA cannot check them.
    url = serving[0]["url"]
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://") + "/healthz", timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/healthz", timeout=5)


def test_an_agent_another_ca_signed_is_refused_by_the_coordinator(
    cluster: Cluster, agent_zygote: Zygote
) -> None:
    """Both agents register (they trust the coordinator), but no call of the coordinator gets through to
    the stranger: a scale to both finds one engine."""
    coordinator = cluster.coordinator
    created = coordinator.api.post(
        "/v1/deployments",
        json={
            "name": "strangers",
            "engine": ENGINE.model_dump(),
            "min_dp_size": 1,
            "launcher": "static",
            "agent_key": AGENT_KEY,  # what start_agents gives its agents
        },
    )
    assert created.status_code == 201, created.text
    stranger, friend = cluster.other.server("stranger"), cluster.ca.server("friend")
    agents = start_agents(
        ["stranger", "friend"],
        cluster.tmp,
        flags={"coordinator": coordinator.url, "deployment": "strangers", "heartbeat_s": "1"},
        engine_args=engine_args(ENGINE),
        env={"EPCTL_TOKEN": coordinator.admin_token, "EPCTL_AGENT_TLS_CA_FILE": str(cluster.ca.ca_file)},
        per_agent_env={
            "stranger": {
                "EPCTL_AGENT_TLS_CERT_FILE": str(stranger.cert),
                "EPCTL_AGENT_TLS_KEY_FILE": str(stranger.key),
            },
            "friend": {
                "EPCTL_AGENT_TLS_CERT_FILE": str(friend.cert),
                "EPCTL_AGENT_TLS_KEY_FILE": str(friend.key),
            },
        },
        zygote=agent_zygote,  # forked from the session's warmed interpreter: no torch import each
    )
    try:
        wait_until(
            lambda: len(coordinator.engines("strangers")) == 2 or None,
            timeout_s=30,
            what="both agents to register",
        )
        # All or nothing: a partial grow would commit the friend alone (issue 38), and the refusal of the
        # stranger is what this test reads off the job.
        job = coordinator.wait_job(coordinator.scale(2, "strangers", all_or_nothing=True))
        assert job["state"] == "rolled_back", job
        assert "needs 2 idle registered engines, 1 available" in str(job), job
        assert "idle engine stranger skipped" in coordinator.log_tail(20000)
        assert "CERTIFICATE_VERIFY_FAILED" in coordinator.log_tail(20000)
        assert "idle engine friend skipped" not in coordinator.log_tail(20000)
    finally:
        for agent in agents:
            agent.child.stop()


def test_a_coordinator_another_ca_signed_is_refused_by_an_agent(
    cluster: Cluster, agent_zygote: Zygote
) -> None:
    coordinator = cluster.coordinator
    created = coordinator.api.post(
        "/v1/deployments", json={"name": "doubters", "engine": ENGINE.model_dump(), "launcher": "static"}
    )
    assert created.status_code == 201, created.text
    files = cluster.ca.server("doubter")
    (agent,) = start_agents(
        ["doubter"],
        cluster.tmp,
        flags={"coordinator": coordinator.url, "deployment": "doubters", "log_level": "info"},
        engine_args=engine_args(ENGINE),
        env={
            "EPCTL_TOKEN": coordinator.admin_token,
            "EPCTL_AGENT_TLS_CERT_FILE": str(files.cert),
            "EPCTL_AGENT_TLS_KEY_FILE": str(files.key),
            "EPCTL_AGENT_TLS_CA_FILE": str(cluster.other.ca_file),  # not the CA that signed the coordinator
        },
        zygote=agent_zygote,
    )
    try:
        agent.child.wait_for(
            lambda: "CERTIFICATE_VERIFY_FAILED" in agent.child.log_tail() or None,
            timeout_s=30,
            what="the agent to refuse the coordinator's certificate",
        )
        assert coordinator.engines("doubters") == []
    finally:
        agent.child.stop()
