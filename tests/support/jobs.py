"""Jobs through any coordinator's API (an httpx client with a token): read, ask for, wait for."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import httpx

from tests.support.waiting import wait_until

TERMINAL_JOB_STATES = frozenset({"succeeded", "rolled_back", "failed", "cancelled"})


def job(api: httpx.Client, job_id: str) -> dict[str, Any]:
    response = api.get(f"/v1/reconfigurations/{job_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_job(
    api: httpx.Client,
    job_id: str,
    *,
    timeout_s: float = 90.0,
    until: Iterable[str] = TERMINAL_JOB_STATES,
    describe: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """The job once its state is one of `until` (default: any terminal state)."""
    wanted = set(until)
    seen: dict[str, Any] = {}

    def reached() -> dict[str, Any] | None:
        seen.update(job(api, job_id))
        return dict(seen) if seen["state"] in wanted else None

    return wait_until(
        reached,
        timeout_s=timeout_s,
        what=f"job {job_id} to reach {sorted(wanted)}",
        interval_s=0.05,
        describe=lambda: f"last seen: {seen}\n{describe() if describe else ''}",
    )


def scale(api: httpx.Client, deployment: str, target: int, **fields: Any) -> str:
    """Ask for a reconfiguration; the new job's id (202 expected)."""
    body = {"deployment": deployment, "target_dp_size": target, **fields}
    response = api.post("/v1/reconfigurations", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def bring_to_size(api: httpx.Client, deployment: str, size: int, *, timeout_s: float = 120.0) -> None:
    """Scale `deployment` to `size` unless it is there already: a test states the size it starts from."""
    current = api.get(f"/v1/deployments/{deployment}").json()["current_dp_size"]
    if current != size:
        finished = wait_job(api, scale(api, deployment, size), timeout_s=timeout_s)
        assert finished["state"] == "succeeded", finished
