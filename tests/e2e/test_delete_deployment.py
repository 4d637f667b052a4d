"""Deleting a deployment stops the engines its launcher started: none runs on, re-registering with a
deployment that no longer exists (they used to)."""

from __future__ import annotations

import os
import uuid

from tests.support.e2e import Stack
from tests.support.stack import agent_info
from tests.support.waiting import wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state letter says it exited.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_deleting_a_deployment_stops_its_engines(stack: Stack) -> None:
    coordinator = stack.coordinator
    name = f"doomed-{uuid.uuid4().hex[:6]}"
    coordinator.create_deployment(name)
    job = stack.scale_to(1, name)
    assert job["state"] == "succeeded", job["error"]
    [member] = coordinator.members(job)
    pid = int(agent_info(member["url"])["pid"])

    assert coordinator.api.delete(f"/v1/deployments/{name}").status_code == 204

    wait_until(lambda: not _alive(pid), timeout_s=30, what=f"engine pid {pid} of {name} to exit")
    assert coordinator.api.get(f"/v1/deployments/{name}").status_code == 404
    # The shared deployment's engines were not touched.
    stack.assert_outputs_correct(stack.serving_urls())
