"""One EP generation across test hosts, and the network between them as a fault (issue 24).

Four test hosts (network namespaces, `tests/support/netns.py`), one `static` agent started by hand in
each (`--host` its control address, `--data-host` its data address); the coordinator in the root
namespace on the control network only. One deployment for the whole module (starting agents is the
slow part): the tests run in file order, each stating the size it starts from, and every fault is
followed by the invariant check of `tests/support/invariants.py`. One test per boundary the hosts add:
a cut control link, a cut data link, a whole host lost (a coordinator cut off from every host is the
liveness judge's rows, tests/runner/test_liveness_rules.py, and tests/runner/test_network_faults.py).

What a host's clients see is measured from inside that host (`HostClient`): a client thread in each
host's namespace, sending to the engine(s) of that host over the host's own control address.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from app.frontdoor.haproxy import DoorConfig
from app.frontdoor.launch import RunningDoor, haproxy_binary, start_front_door
from engine_agent import moe
from tests.frontdoor.conftest import require_haproxy
from tests.hosts.cluster import HostAgent, HostClient, HostsCoordinator, registered, start_host_agents
from tests.support.databases import sqlite_database
from tests.support.e2e import Stack
from tests.support.invariants import assert_recovered
from tests.support.jobs import bring_to_size
from tests.support.netns import Host, Hosts
from tests.support.processes import free_port
from tests.support.stack import ENGINE, SteadyClient, failures_around
from tests.support.waiting import wait_until

HOSTS = 4
WINDOW_MARGIN_S = 0.05  # as tests/e2e/test_reconfiguration.py: a request that overlaps a commit window


@dataclass
class Cluster:
    hosts: Hosts
    stack: Stack
    agents: dict[str, HostAgent]  # by engine id
    workdir: Path
    door: RunningDoor | None  # the deployment's front door (None: HAProxy not installed)

    @property
    def coordinator(self) -> HostsCoordinator:
        assert isinstance(self.stack.coordinator, HostsCoordinator)
        return self.stack.coordinator

    def members(self) -> list[HostAgent]:
        """The serving engines, in rank order."""
        rows = sorted(
            (e for e in registered(self.coordinator).values() if e["state"] == "serving"),
            key=lambda e: e["dp_rank"],
        )
        return [self.agents[e["id"]] for e in rows]

    def clients(self, hosts: list[Host] | None = None) -> list[HostClient]:
        """One steady client on each of `hosts` (default: every host with a serving engine), sending to
        its own host's engine."""
        members = self.members()
        chosen = hosts or [m.host for m in members]
        by_host = {m.host.netns: m.url for m in members}
        return [
            HostClient(
                [by_host[h.netns]], self.stack.tokens, self.stack.expected, streams=1, period_s=0.02, host=h
            ).start()
            for h in chosen
        ]

    def size_to(self, size: int) -> None:
        bring_to_size(self.coordinator.api, "demo", size)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("hosts")
    hosts = Hosts.build(HOSTS)
    coordinator = HostsCoordinator(sqlite_database(tmp, migrated=True), tmp / "data")
    agents: list[HostAgent] = []
    door = _front_door(tmp)  # in the root namespace, beside the coordinator; it reaches every host's engine
    if door is not None:
        spec = {"deployment": "demo", "url": door.url, "socket": door.socket_path, "poll_s": 0.05}
        coordinator.front_doors = json.dumps([spec])
    try:
        coordinator.start(ready_timeout_s=60.0)
        coordinator.create_deployment("demo", launcher="static", on_engine_loss="replace")
        placement = [(hosts[i], f"h{i}-e") for i in range(1, HOSTS + 1)]
        agents = start_host_agents(hosts, placement, tmp, coordinator)
        wait_until(
            lambda: len([e for e in coordinator.engines() if e["state"] == "idle"]) == HOSTS,
            timeout_s=30,
            what="every host's agent to register idle",
        )
        tokens = torch.randn(6, ENGINE.hidden_size, generator=torch.Generator().manual_seed(7))
        stack = Stack(
            backend="sqlite",
            coordinator=coordinator,
            tokens=tokens.tolist(),
            expected=moe.reference_forward(ENGINE, tokens).tolist(),
        )
        yield Cluster(hosts, stack, {a.engine_id: a for a in agents}, tmp, door)
    finally:
        for agent in agents:
            agent.child.kill()
        coordinator.close()
        if door is not None:
            door.stop()
        hosts.close()


def _front_door(tmp: Path) -> RunningDoor | None:
    """HAProxy as the deployment's front door, where it is installed (the tests that need it skip)."""
    if haproxy_binary() is None:
        return None
    return start_front_door(tmp / "front-door", DoorConfig("demo", "127.0.0.1", free_port()))


def stop_all(clients: list[HostClient]) -> list[Any]:
    return [s for c in clients for s in c.stop()]


def assert_exact(samples: list[Any]) -> None:
    ok = [s for s in samples if s.ok]
    assert ok, "no request succeeded"
    assert all(s.max_abs_error is not None and s.max_abs_error < 1e-4 for s in ok)


def test_a_generation_spans_hosts_through_a_2_4_3_2_cycle(cluster: Cluster) -> None:
    coordinator = cluster.coordinator
    for engine_id, row in registered(coordinator).items():  # each engine's hosts on its record
        agent = cluster.agents[engine_id]
        assert row["url"].startswith(f"http://{agent.host.control}:"), row
        assert row["data_host"] == agent.host.data, row
    cluster.size_to(2)
    clients = cluster.clients()
    jobs: list[dict[str, Any]] = []
    try:
        for target in (4, 3, 2):
            job = coordinator.wait_job(coordinator.scale(target), timeout_s=120)
            assert job["state"] == "succeeded", job
            jobs.append(job)
            for c in clients:
                c.wait_serving(count=3)
    finally:
        samples = stop_all(clients)
    assert_exact(samples)
    windows = [(float(j["downtime"]["window_start"]), float(j["downtime"]["window_end"])) for j in jobs]
    outside = [
        s
        for s in samples
        if not s.ok
        and not any(s.sent_at <= e + WINDOW_MARGIN_S and s.done_at >= b - WINDOW_MARGIN_S for b, e in windows)
    ]
    assert outside == [], f"a host's client failed outside every commit window: {outside[:3]}"
    for job in jobs:
        members = coordinator.members(job)
        hosts_of = {cluster.agents[m["engine_id"]].host.netns for m in members}
        assert len(hosts_of) == len(members) >= 2, (
            members
        )  # one engine per host: every generation spans hosts
        for result in job["engine_results"]:  # the job names each engine's host (control URL)
            assert result["url"] == cluster.agents[result["engine_id"]].url
        moved = [r for r in job["engine_results"] if r["bytes_moved"]]
        assert moved, f"job {job['id']} moved no expert host to host"
        assert {r["transfer_backend"] for r in moved} == {"nixl"}, moved  # NIXL when every agent offers it
    assert_recovered(cluster.stack, "demo")


def test_the_gloo_weight_channel_moves_experts_host_to_host(cluster: Cluster) -> None:
    coordinator = cluster.coordinator
    cluster.size_to(2)
    coordinator.restart(EPCTL_RUNNER_TRANSFER_BACKEND="gloo")
    try:
        job = coordinator.wait_job(coordinator.scale(4), timeout_s=120)
    finally:
        coordinator.restart()
    assert job["state"] == "succeeded", job
    moved = [r for r in job["engine_results"] if r["bytes_moved"]]
    assert moved and {r["transfer_backend"] for r in moved} == {"gloo"}, job["engine_results"]
    assert_recovered(cluster.stack, "demo")


def conditions(cluster: Cluster) -> list[dict[str, Any]]:
    """The lost-link conditions."""
    return [
        c
        for c in cluster.coordinator.deployment()["conditions"]
        if c["type"] == "engine-unreachable-from-coordinator"
    ]


def test_a_cut_control_link_is_a_condition_not_a_lost_engine(cluster: Cluster) -> None:
    coordinator = cluster.coordinator
    cluster.size_to(2)
    cut = cluster.members()[1]
    clients = cluster.clients()
    try:
        with cluster.hosts.cut_off([cut.host], "control"):
            wait_until(
                lambda: (
                    [(c["type"], c["engine_id"]) for c in conditions(cluster)]
                    == [("engine-unreachable-from-coordinator", cut.engine_id)]
                ),
                timeout_s=30,
                what=f"the condition naming {cut.engine_id}",
                describe=lambda: str(coordinator.deployment()),
            )
            deployment = coordinator.deployment()
            assert deployment["status"] == "ready" and deployment["active_job_id"] is None, deployment
            assert registered(coordinator)[cut.engine_id]["link_lost_at"] is not None
            assert registered(coordinator)[cut.engine_id]["state"] == "serving"
            refused = coordinator.request_scale(3)
            assert refused.status_code == 409, refused.text
            assert (
                refused.json()["code"] == "membership-unknown" and cut.engine_id in refused.json()["detail"]
            )
            for c in clients:  # the cut host's clients are still served by its engine
                c.wait_serving(count=5)
            assert coordinator.deployment()["active_job_id"] is None  # nothing healed
    finally:
        samples = stop_all(clients)
    failures = [s for s in samples if not s.ok]
    assert failures == [], f"clients failed while a control link was cut: {failures[:3]}"
    assert_exact(samples)
    wait_until(lambda: conditions(cluster) == [], timeout_s=30, what="the condition to clear")
    accepted = coordinator.wait_job(coordinator.scale(3), timeout_s=120)
    assert accepted["state"] == "succeeded", accepted
    assert_recovered(cluster.stack, "demo")


def test_a_cut_data_link_re_forms_on_the_rest_then_grows_back(cluster: Cluster) -> None:
    coordinator = cluster.coordinator
    cluster.size_to(4)
    cut = cluster.members()[3]
    survivors = [m for m in cluster.members() if m is not cut]
    with cluster.hosts.cut_off([cut.host], "data"):
        wait_until(
            lambda: (
                registered(coordinator)[cut.engine_id]["state"] == "fenced" and len(cluster.members()) == 3
            ),
            timeout_s=90,
            what=f"{cut.engine_id} fenced and the other three serving",
            describe=lambda: str(list(registered(coordinator).values())),
        )
        assert {m.engine_id for m in cluster.members()} == {m.engine_id for m in survivors}
        cluster.stack.assert_outputs_correct([m.url for m in survivors])
    wait_until(
        lambda: coordinator.deployment()["current_dp_size"] == 4 and len(cluster.members()) == 4,
        timeout_s=120,
        what="replace to grow the deployment back to 4 once the link is back",
        describe=lambda: str(coordinator.deployment()),
    )
    assert_recovered(cluster.stack, "demo")


def test_a_cut_data_link_through_the_front_door_takes_the_cut_side_out_and_serves_the_rest(
    cluster: Cluster,
) -> None:
    """Four engines on four hosts behind the front door (HAProxy in the root namespace), a client sending
    only to it; one host's data link cut. The cut engine is `out` (fenced) in the feed from the first
    version that does not list it `ready`, never `ready` again while cut; requests fail only from the
    cut until the other three serve again (the group breaks with the link: its collective fails), none
    after; once the link is back the deployment grows back to 4 and the front door serves all four."""
    require_haproxy()
    assert cluster.door is not None
    coordinator = cluster.coordinator
    cluster.size_to(4)
    api = coordinator.api

    def feed() -> dict[str, Any]:
        found: dict[str, Any] = api.get("/v1/deployments/demo/endpoints").json()
        return found

    def states() -> dict[str, str]:
        return {e["engine_id"]: e["state"] for e in feed()["endpoints"]}

    wait_until(
        lambda: (
            sorted(s for s in states().values() if s == "ready") == ["ready"] * 4
            and feed()["front_door"]["applied_version"] == feed()["resourceVersion"]
        ),
        timeout_s=60,
        what="the front door serving the four engines",
    )
    client = SteadyClient(
        [cluster.door.url], cluster.stack.tokens, cluster.stack.expected, streams=2, period_s=0.02
    ).start()
    client.wait_serving(count=20, timeout_s=60)
    cut = cluster.members()[3]
    seen: list[str] = []
    with cluster.hosts.cut_off([cut.host], "data"):
        cut_at = time.time()

        def out_and_three_serving() -> bool:
            seen.append(states().get(cut.engine_id, "gone"))
            return registered(coordinator)[cut.engine_id]["state"] == "fenced" and len(cluster.members()) == 3

        wait_until(
            out_and_three_serving, timeout_s=90, what=f"{cut.engine_id} fenced and the other three serving"
        )
        client.wait_serving(count=50, timeout_s=60)  # served on the three
        served_again_at = time.time()
        seen.append(states().get(cut.engine_id, "gone"))
    wait_until(
        lambda: coordinator.deployment()["current_dp_size"] == 4 and len(cluster.members()) == 4,
        timeout_s=120,
        what="replace to grow the deployment back to 4 once the link is back",
    )
    client.wait_serving(count=20, timeout_s=60)
    samples = client.stop()

    failures_around(samples, cut_at, served_again_at, "a cut data link")
    print(f"the cut engine in the feed while cut: {seen[:3]} ... {seen[-3:]}")
    assert_exact(samples)
    first_out = next(i for i, state in enumerate(seen) if state != "ready")
    assert all(state in ("out", "gone") for state in seen[first_out:]), seen
    assert_recovered(cluster.stack, "demo")


def test_a_whole_host_killed_is_replaced_from_another_host(cluster: Cluster) -> None:
    coordinator = cluster.coordinator
    cluster.size_to(3)
    victim = cluster.members()[2]
    victim.child.kill()  # every process of that host: its one agent
    wait_until(
        lambda: (
            coordinator.deployment()["current_dp_size"] == 3
            and victim.engine_id not in {m.engine_id for m in cluster.members()}
            and len(cluster.members()) == 3
        ),
        timeout_s=120,
        what="self-heal to replace the killed host's engine with the idle one",
        describe=lambda: str(coordinator.deployment()),
    )
    assert_recovered(cluster.stack, "demo")
