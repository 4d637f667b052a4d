"""The invariants every fault must leave intact, checked against the live processes, not the record.

`assert_recovered(stack, name)` waits (bounded) until the deployment settles, then asserts:

- every job of the deployment is terminal (succeeded, failed, rolled_back, cancelled);
- the deployment is `ready` with no active job, and its recorded size and generation equal what the
  live agents report (each agent asked directly, `GET /v1/info`): exactly `current_dp_size` agents
  serve, all on the recorded generation, with ranks 0..size-1 of a group of that size;
- no split brain and no stray: no live agent of the deployment (registered, or started by the local
  launcher) serves or is paused on any other generation, and none is left paused;
- no orphan: every live agent process the local launcher started for the deployment is a registered
  engine whose recorded state is what the agent reports;
- the client is served again: every serving engine answers with the single-process reference outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from app.launchers.local import LocalLauncher
from engine_agent.pids import is_running
from tests.support.e2e import Stack
from tests.support.stack import agent_http
from tests.support.waiting import wait_until

TERMINAL = frozenset({"succeeded", "failed", "rolled_back", "cancelled"})


@dataclass(frozen=True)
class Live:
    """What one live agent says about itself."""

    engine_id: str
    url: str
    state: str
    generation: int
    rank: int | None
    world_size: int


def live_agents(stack: Stack, name: str) -> tuple[dict[str, Live], list[str]]:
    """Every agent of the deployment that answers (registered ones and every process the local
    launcher started for it), and the launcher's live processes no agent answers for (frozen ones)."""
    coordinator = stack.coordinator
    urls = {e["id"]: e["url"] for e in coordinator.engines(name) if e["state"] != "left"}
    unanswered: list[str] = []
    records = LocalLauncher(coordinator.data_dir).records()
    launched = {
        engine_id: entry
        for engine_id, entry in records.items()
        if entry.get("deployment") == name and isinstance(entry.get("pid"), int) and is_running(entry["pid"])
    }
    for engine_id, entry in launched.items():
        if entry.get("url"):
            urls.setdefault(engine_id, entry["url"])
    live: dict[str, Live] = {}
    for engine_id, url in urls.items():
        try:
            info = agent_http.get(f"{url}/v1/info", timeout=3).json()
        except httpx.HTTPError:
            if engine_id in launched:
                unanswered.append(engine_id)
            continue
        live[engine_id] = Live(
            engine_id=info["engine_id"],
            url=url,
            state=info["state"],
            generation=int(info["generation"]),
            rank=info["rank"],
            world_size=int(info["world_size"]),
        )
    return live, unanswered


def _mismatches(stack: Stack, name: str) -> list[str]:
    """Why the deployment does not (yet) meet the invariants; empty once it does."""
    coordinator = stack.coordinator
    problems: list[str] = []
    jobs = coordinator.api.get("/v1/reconfigurations", params={"deployment": name, "limit": 100})
    assert jobs.status_code == 200, jobs.text
    for job in jobs.json()["data"]:
        if job["state"] not in TERMINAL:
            problems.append(f"job {job['id']} is {job['state']} ({job['requested_by']})")
    deployment = coordinator.deployment(name)
    size, generation = int(deployment["current_dp_size"]), int(deployment["generation"])
    if deployment["status"] != "ready" or deployment["active_job_id"] is not None:
        problems.append(
            f"deployment is {deployment['status']} ({deployment['status_detail']}), "
            f"active job {deployment['active_job_id']}"
        )
    live, unanswered = live_agents(stack, name)
    if unanswered:
        problems.append(f"live agent processes that do not answer: {unanswered}")
    members = [a for a in live.values() if a.state == "serving" and a.generation == generation]
    others = [
        a for a in live.values() if a.state != "idle" and a not in members
    ]  # serving or paused elsewhere: a second group, or an engine left paused
    if others:
        problems.append(f"agents outside generation {generation} that are not idle: {others}")
    ranks = sorted(a.rank for a in members if a.rank is not None)
    if len(members) != size or ranks != list(range(size)) or any(a.world_size != size for a in members):
        problems.append(f"recorded size {size} at generation {generation}, agents serving it: {members}")
    registered = {e["id"]: e for e in coordinator.engines(name)}
    for agent in live.values():
        row = registered.get(agent.engine_id)
        if row is None or row["state"] in ("left", "unreachable"):
            problems.append(f"orphan: agent {agent.engine_id} ({agent.state}) is not a registered engine")
        elif row["state"] != agent.state or int(row["generation"]) != agent.generation:
            problems.append(
                f"engine {agent.engine_id} recorded {row['state']} at generation {row['generation']}, "
                f"the agent says {agent.state} at {agent.generation}"
            )
    return problems


def assert_recovered(stack: Stack, name: str, timeout_s: float = 90.0) -> dict[str, Any]:
    """Wait until the deployment settles into the invariants (see the module docstring), then check
    that its engines serve correct outputs. Returns the deployment."""
    last: list[list[str]] = [[]]

    def settled() -> bool:
        last[0] = _mismatches(stack, name)
        return not last[0]

    wait_until(
        settled,
        timeout_s=timeout_s,
        what=f"deployment {name} to settle with its record equal to its agents",
        interval_s=0.3,
        describe=lambda: "\n".join(last[0]),
    )
    live, _ = live_agents(stack, name)
    deployment = stack.coordinator.deployment(name)
    stack.assert_outputs_correct(
        [a.url for a in live.values() if a.state == "serving" and a.generation == deployment["generation"]]
    )
    return deployment
