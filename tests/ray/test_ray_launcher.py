"""`launcher: ray` on a real two-node Ray cluster: engines placed by Ray, scaled with exact outputs,
launch failures rolled back with Ray's cause, and a coordinator restart that finds its Ray engines.

The tests share one coordinator process (uvicorn, job runner on, SQLite), except the one that kills and
restarts its own; each test has its own deployment in its own Ray namespace and leaves no engine actor
behind, so none depends on another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from app.core.db import make_engine
from app.launchers.base import LaunchSpec
from app.launchers.ray_launcher import RayLauncher
from engine_agent import moe
from engine_agent.environment import LAUNCHER_GIVES, allowed
from tests.ray.conftest import RayCluster, import_ray
from tests.support.databases import sqlite_database
from tests.support.stack import ENGINE, StackCoordinator, agent_http, infer
from tests.support.waiting import wait_until

ray = import_ray()
pytestmark = pytest.mark.ray

TOKENS = torch.randn(6, ENGINE.hidden_size, generator=torch.Generator().manual_seed(7))
EXPECTED = moe.reference_forward(ENGINE, TOKENS)


@dataclass
class RayStack:
    coordinator: StackCoordinator
    cluster: RayCluster
    name: str

    @property
    def namespace(self) -> str:
        return f"epctl-test-{self.name}"

    def settings(self, **ray_settings: Any) -> dict[str, Any]:
        return {
            "address": self.cluster.address,
            "namespace": self.namespace,
            "num_cpus": 0.5,  # logical: room for every test's engines on 2 x 2 CPUs
            "placement_strategy": "SPREAD",
            "placement_timeout_s": 20,
            **ray_settings,
        }

    def create(self, **ray_settings: Any) -> dict[str, Any]:
        return self.coordinator.create_deployment(
            self.name, launcher="ray", ray=self.settings(**ray_settings)
        )

    def scale(self, target: int) -> dict[str, Any]:
        return self.coordinator.wait_job(self.coordinator.scale(target, self.name), timeout_s=120)

    def member_ids(self, job: dict[str, Any]) -> list[str]:
        return [m["engine_id"] for m in self.coordinator.members(job)]

    def assert_outputs_exact(self, job: dict[str, Any]) -> None:
        """Every member's answer equals the single-process computation of the same MoE layer."""
        members = self.coordinator.members(job)
        assert len(members) == job["to_dp_size"]
        for member in members:
            response = infer(member["url"], TOKENS.tolist())
            assert response.status_code == 200, f"{member['engine_id']}: {response.text}"
            got = torch.tensor(response.json()["outputs"])
            assert torch.allclose(got, EXPECTED, rtol=1e-5, atol=1e-6), (
                f"{member['engine_id']}: wrong outputs"
            )

    def alive(self) -> dict[str, Any]:
        return self.cluster.alive_actors(self.namespace)

    def describe(self, engine_id: str) -> dict[str, Any]:
        actor = ray.get_actor(engine_id, namespace=self.namespace)
        return dict(ray.get(actor.describe.remote(), timeout=30))


def new_coordinator(directory: Path) -> StackCoordinator:
    coordinator = StackCoordinator(
        sqlite_database(directory, migrated=True),
        directory / "data",
        # A Ray worker, then torch in the agent, start slowly on 2 busy cores: room for that.
        env={"EPCTL_RUNNER_LAUNCH_DEADLINE_S": "120"},
    )
    return coordinator.start()


def deployment_name(request: pytest.FixtureRequest) -> str:
    return request.node.name.removeprefix("test_").replace("_", "-")[:30].rstrip("-")


@pytest.fixture(scope="module")
def shared_coordinator(
    ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StackCoordinator]:
    """One coordinator for the tests that do not restart it; each test has its own deployment and Ray
    namespace, so none depends on another."""
    coordinator = new_coordinator(tmp_path_factory.mktemp("ray-coordinator"))
    try:
        yield coordinator
    finally:
        coordinator.close()


@pytest.fixture
def stack(
    ray_cluster: RayCluster, shared_coordinator: StackCoordinator, request: pytest.FixtureRequest
) -> Iterator[RayStack]:
    stack = RayStack(coordinator=shared_coordinator, cluster=ray_cluster, name=deployment_name(request))
    try:
        yield stack
    finally:
        # The coordinator outlives this test: killing the engines under a deployment that heals by
        # `replace` (the default for Ray) would have it launch fresh ones, filling the shared cluster
        # for the tests after this one.
        shared_coordinator.api.patch(f"/v1/deployments/{stack.name}", json={"on_engine_loss": "none"})
        ray_cluster.kill_namespace(stack.namespace)


@pytest.fixture
def own_stack(ray_cluster: RayCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RayStack]:
    """A coordinator of its own, for a test that kills and restarts it."""
    stack = RayStack(
        coordinator=new_coordinator(tmp_path), cluster=ray_cluster, name=deployment_name(request)
    )
    try:
        yield stack
    finally:
        stack.coordinator.close()
        ray_cluster.kill_namespace(stack.namespace)


def test_scales_0_2_3_2_with_engines_placed_and_run_by_ray(stack: RayStack) -> None:
    stack.create()
    cluster = stack.cluster

    job = stack.scale(2)
    assert job["state"] == "succeeded", job["error"]
    stack.assert_outputs_exact(job)
    first = stack.member_ids(job)
    actors = stack.alive()
    assert set(actors) == set(first)  # Ray's own view: one live actor per engine, named after it
    assert {a.class_name for a in actors.values()} == {"AgentHost"}
    assert {a.node_id for a in actors.values()} == cluster.node_ids()  # SPREAD: one engine per node
    for engine_id in first:
        where = stack.describe(engine_id)
        assert where["node_id"] == actors[engine_id].node_id
        agent = psutil.Process(where["agent_pid"])
        # The agent is the actor's child process: the engine really runs inside Ray.
        assert agent.ppid() == where["actor_pid"] == actors[engine_id].pid
        command = " ".join(agent.cmdline())
        assert engine_id in command and "--token" not in command  # the token travels in the environment
        # Its environment is the engines' allow-list of the Ray worker's, and what it is given by name.
        given = agent.environ()
        assert given["EPCTL_AGENT_KEY"] and given["EPCTL_TOKEN"]
        assert all(allowed(name) or name in LAUNCHER_GIVES for name in given), sorted(given)
    engines = {e["id"]: e for e in stack.coordinator.engines(stack.name)}
    assert {engines[i]["launched_by"] for i in first} == {"ray"}

    # The agent's log is the actor's log, as Ray keeps it.
    from ray.util.state import get_log

    log_text = "".join(get_log(actor_id=actors[first[0]].actor_id, suffix="out", tail=200))
    assert f"epctl: engine {first[0]} on Ray node" in log_text and engines[first[0]]["url"] in log_text

    job = stack.scale(3)
    assert job["state"] == "succeeded", job["error"]
    stack.assert_outputs_exact(job)
    members = stack.member_ids(job)
    assert members[:2] == first and set(stack.alive()) == set(members)
    joiner = members[2]

    job = stack.scale(2)
    assert job["state"] == "succeeded", job["error"]
    stack.assert_outputs_exact(job)
    assert stack.member_ids(job) == first
    # The leaver was stopped after cleanup: its actor is dead in Ray's view and its agent is gone.
    wait_until(lambda: set(stack.alive()) == set(first), timeout_s=60, what="the leaver's actor stopped")
    dead = {a.name: a for a in cluster.actors(stack.namespace) if a.state == "DEAD"}
    assert joiner in dead
    left = {e["id"]: e["state"] for e in stack.coordinator.engines(stack.name)}
    assert left[joiner] == "left"
    # Its placement group went with it; the first engines' group stays while they run.
    groups = ray.util.placement_group_table()
    states = {g["name"]: g["state"] for g in groups.values() if g["name"].startswith(f"{stack.namespace}/")}
    batch = joiner.rsplit("-", 2)[-2]
    assert states[f"{stack.namespace}/{stack.name}-{batch}"] == "REMOVED"
    assert states[f"{stack.namespace}/{first[0].rsplit('-', 1)[0]}"] == "CREATED"


def test_more_resources_than_the_cluster_has_rolls_back_with_rays_cause(stack: RayStack) -> None:
    stack.create(num_cpus=3, placement_timeout_s=3)  # no node has 3 CPUs
    job = stack.scale(2)
    assert job["state"] == "rolled_back", job
    error = job["error"]
    assert error["type"] == "ray-no-resources" and error["phase"] == "preparing"
    assert error["engine_id"].startswith(f"{stack.name}-") and error["engine_id"] in error["message"]
    assert "INFEASIBLE" in error["message"] and "CPU: 3" in error["message"], error["message"]
    assert job["downtime_ms"] == 0
    # Nothing left running: no actor, no placement group, no engine.
    assert stack.alive() == {}
    groups = ray.util.placement_group_table()
    assert all(
        g["state"] == "REMOVED" for g in groups.values() if g["name"].startswith(f"{stack.namespace}/")
    )
    assert [e for e in stack.coordinator.engines(stack.name) if e["state"] != "left"] == []
    assert stack.coordinator.deployment(stack.name)["current_dp_size"] == 0


def test_an_agent_that_dies_while_starting_rolls_back_with_its_cause(stack: RayStack, tmp_path: Path) -> None:
    # The engines' environment puts this directory first on the path: the agent's web server import
    # finds this module and the agent exits before it serves.
    broken = tmp_path / "broken-env"
    broken.mkdir()
    (broken / "uvicorn.py").write_text("raise SystemExit(3)\n")
    stack.create(runtime_env={"env_vars": {"PYTHONPATH": str(broken)}})
    job = stack.scale(2)
    assert job["state"] == "rolled_back", job
    error = job["error"]
    assert error["type"] == "ray-agent-failed", error
    assert error["engine_id"] in error["message"] and "exited with code 3" in error["message"], error
    assert stack.alive() == {}  # the other engine of the batch was stopped too
    assert [e for e in stack.coordinator.engines(stack.name) if e["state"] != "left"] == []


def test_a_node_lost_while_its_engine_starts_rolls_back_with_rays_cause(
    stack: RayStack, tmp_path: Path
) -> None:
    # A third node only this test may use (custom resource), and an agent that never finishes importing
    # its web server, so the node is lost while the launch waits for that agent.
    slow = tmp_path / "slow-env"
    slow.mkdir()
    (slow / "uvicorn.py").write_text("import time\ntime.sleep(600)\n")
    node = stack.cluster.cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"doomed": 1})
    try:
        stack.create(resources={"doomed": 1}, runtime_env={"env_vars": {"PYTHONPATH": str(slow)}})
        job_id = stack.coordinator.scale(1, stack.name)
        engine_id = wait_until(
            lambda: next(iter(stack.alive()), None), timeout_s=60, what="the engine's actor alive"
        )
        assert stack.alive()[engine_id].node_id == node.node_id
        agent_pid = stack.describe(engine_id)["agent_pid"]
        stack.cluster.cluster.remove_node(node, allow_graceful=False)
        job = stack.coordinator.wait_job(job_id, timeout_s=90)
    finally:
        if node in stack.cluster.cluster.worker_nodes:
            stack.cluster.cluster.remove_node(node)
    assert job["state"] == "rolled_back", job
    error = job["error"]
    assert error["type"] == "ray-actor-died" and error["engine_id"] == engine_id, error
    assert engine_id in error["message"] and "actor" in error["message"], error
    assert stack.alive() == {} and not psutil.pid_exists(agent_pid)  # nothing left running


def test_an_engine_actor_killed_during_prepare_rolls_back(stack: RayStack) -> None:
    stack.create()
    serving = stack.scale(1)
    assert serving["state"] == "succeeded", serving["error"]
    member = stack.coordinator.members(serving)[0]
    # The member stops before the new groups form, so the job stays in prepare while we kill the joiner.
    faults = agent_http.post(f"{member['url']}/v1/faults", json={"hang_prepare_at_step": "agree"}, timeout=10)
    assert faults.status_code == 200, faults.text
    job_id = stack.coordinator.scale(2, stack.name)

    def joiner_at_agree() -> str | None:
        status = agent_http.get(f"{member['url']}/v1/reconfig", timeout=5).json()
        results = stack.coordinator.job(job_id)["engine_results"]
        joiners = [r["engine_id"] for r in results if r.get("role") == "joining"]
        return joiners[0] if joiners and status.get("step") == "agree" else None

    joiner = wait_until(
        joiner_at_agree, timeout_s=60, what="the job to hold in prepare with its joiner started"
    )
    assert stack.coordinator.job(job_id)["state"] == "preparing"
    ray.kill(ray.get_actor(joiner, namespace=stack.namespace), no_restart=True)

    job = stack.coordinator.wait_job(job_id, timeout_s=60)
    assert job["state"] == "rolled_back", job
    assert job["error"]["engine_id"] == joiner and job["error"]["phase"] == "preparing", job["error"]
    assert job["downtime_ms"] == 0
    dead = {a.name: a for a in stack.cluster.actors(stack.namespace) if a.state == "DEAD"}
    assert "ray.kill" in str(dead[joiner].death_cause)
    assert set(stack.alive()) == {member["engine_id"]}
    engines = {e["id"]: e["state"] for e in stack.coordinator.engines(stack.name)}
    assert engines[joiner] == "left"
    stack.assert_outputs_exact(serving)  # the old generation never stopped serving
    # The launcher tells why, in Ray's terms (for the job's error once the runner asks it).
    launcher = RayLauncher(make_engine(stack.coordinator.database_url))
    spec = LaunchSpec(deployment=stack.name, engine=ENGINE)
    causes = asyncio.run(launcher.explain(spec, [joiner, member["engine_id"]]))
    assert "DEAD" in causes[joiner] and "ray.kill" in causes[joiner], causes
    assert "alive" in causes[member["engine_id"]], causes


def test_a_restarted_coordinator_finds_its_ray_engines(own_stack: RayStack) -> None:
    stack = own_stack
    coordinator = stack.coordinator
    stack.create()
    job = stack.scale(1)
    assert job["state"] == "succeeded", job["error"]
    first = stack.member_ids(job)
    actor_ids = {name: a.actor_id for name, a in stack.alive().items()}

    # The coordinator stops mid-job (SIGKILL once the job is prepared): its engines run on in Ray.
    coordinator.stop()
    coordinator.start(EPCTL_RUNNER_TEST_HANG_AT="prepared")
    job_id = coordinator.scale(2, stack.name)
    assert coordinator.wait_marker() == "prepared"
    joiner = next(
        r["engine_id"] for r in coordinator.job(job_id)["engine_results"] if r.get("role") == "joining"
    )
    assert set(stack.alive()) == {*first, joiner}
    coordinator.kill()

    # A new coordinator (no memory of the launch) reconciles the job and stops the joiner by name.
    coordinator.start()
    job = coordinator.wait_job(job_id, timeout_s=90)
    assert job["state"] == "rolled_back" and job["error"]["type"] == "coordinator-restarted", job
    wait_until(lambda: joiner not in stack.alive(), timeout_s=60, what="the joiner's actor stopped")
    alive = stack.alive()
    assert {name: a.actor_id for name, a in alive.items()} == actor_ids  # the same engine, untouched
    assert {e["id"]: e["state"] for e in coordinator.engines(stack.name)}[joiner] == "left"

    # And it drives it on: the next scale-up keeps the engine it found.
    job = stack.scale(2)
    assert job["state"] == "succeeded", job["error"]
    assert stack.member_ids(job)[:1] == first
    stack.assert_outputs_exact(job)


def test_an_engine_whose_launch_outlived_its_coordinator_is_stopped_at_the_next_launch(
    own_stack: RayStack, tmp_path: Path
) -> None:
    stack = own_stack
    coordinator = stack.coordinator
    slow = tmp_path / "slow-env"
    slow.mkdir()
    (slow / "uvicorn.py").write_text("import time\ntime.sleep(600)\n")
    stack.create(runtime_env={"env_vars": {"PYTHONPATH": str(slow)}})
    job_id = coordinator.scale(1, stack.name)
    orphan = wait_until(
        lambda: next(iter(stack.alive()), None),
        timeout_s=120,  # a Ray worker with a runtime env starts slowly on loaded cores (60 s ran out once)
        what="the engine's actor alive",
        describe=lambda: str(coordinator.api.get(f"/v1/reconfigurations/{job_id}").json()),
    )
    coordinator.kill()  # mid-launch: the detached actor outlives it, unknown to the database

    coordinator.start()
    job = coordinator.wait_job(job_id, timeout_s=90)
    assert job["state"] == "rolled_back", job
    assert set(stack.alive()) == {orphan}
    assert orphan not in {e["id"] for e in coordinator.engines(stack.name)}
    # The next launch of the deployment stops the orphan before it reserves anything, then starts anew.
    fixed = coordinator.api.patch(
        f"/v1/deployments/{stack.name}", json={"ray": {**stack.settings(), "runtime_env": None}}
    )
    assert fixed.status_code == 200, fixed.text
    job = stack.scale(1)
    assert job["state"] == "succeeded", job["error"]
    assert set(stack.alive()) == set(stack.member_ids(job)) and orphan not in stack.alive()
    stack.assert_outputs_exact(job)
    groups = ray.util.placement_group_table()
    batch = orphan.rsplit("-", 2)[-2]
    assert {
        g["state"] for g in groups.values() if g["name"] == f"{stack.namespace}/{stack.name}-{batch}"
    } == {"REMOVED"}
