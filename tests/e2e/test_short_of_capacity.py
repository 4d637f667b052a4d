"""A grow short of engines (the launcher can start only some) commits what it reached, and its standing
target completes once capacity is added (issue 38). Agents start through tests/support/capacity_agent.py,
so each is a fresh interpreter (a custom agent command is not forked from the suite's zygote): this
module holds only what needs that command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.support import capacity_agent
from tests.support.e2e import Stack
from tests.support.waiting import wait_until

COORDINATOR_ENV = {
    "EPCTL_RUNNER_LOCAL_AGENT_COMMAND": f"{sys.executable} {Path(capacity_agent.__file__).resolve()}",
    "EPCTL_RUNNER_STANDING_TARGET_RETRY_S": "1",
}


def test_a_grow_short_of_engines_commits_what_it_reached_and_completes_when_capacity_is_added(
    stack: Stack,
) -> None:
    coordinator = stack.coordinator
    capacity = coordinator.data_dir / capacity_agent.CAPACITY_FILE
    capacity.write_text("1")  # the launcher can start one engine of the two asked for
    try:
        job = stack.scale_to(4)
        assert job["state"] == "succeeded", job
        assert (job["to_dp_size"], job["reached_dp_size"], stack.size()) == (4, 3, 3)
        stack.assert_outputs_correct([m["url"] for m in coordinator.members(job)])
        desired = coordinator.deployment()["desired"]
        assert (desired["standing_target"], desired["standing_target_job_id"]) == (4, job["id"])

        capacity.write_text("1")  # capacity appears: the runner's completion job takes it
        done = wait_until(
            lambda: completion(stack, job["id"]), timeout_s=120.0, what="the standing target completed"
        )
        assert (done["to_dp_size"], done["reached_dp_size"], stack.size()) == (4, 4, 4), done
        assert coordinator.deployment()["desired"]["standing_target"] is None
        stack.assert_outputs_correct([m["url"] for m in coordinator.members(done)])
    finally:
        capacity.unlink(missing_ok=True)


def completion(stack: Stack, after: str) -> dict[str, Any] | None:
    """The standing-target job that succeeded after job `after`, once no job is active."""
    if stack.coordinator.deployment()["active_job_id"]:
        return None
    listed = stack.coordinator.api.get("/v1/reconfigurations", params={"deployment": "demo", "limit": 10})
    for job in listed.json()["data"]:
        if job["id"] == after:
            return None
        if job["requested_by"] == "standing-target" and job["state"] == "succeeded":
            return dict(job)
    return None
