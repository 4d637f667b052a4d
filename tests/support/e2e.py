"""The e2e stack as the tests see it (`Stack`): a coordinator with a deployment of reference engines, the
reference outputs to check them by, and the state every test starts from. Shared by tests/e2e (whose
fixtures build it, tests/e2e/conftest.py), tests/hosts and the invariant checks
(tests/support/invariants.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tests.support.stack import StackCoordinator, agent_http, infer

START_SIZE = 2


@dataclass
class Stack:
    backend: str
    coordinator: StackCoordinator
    tokens: list[list[float]]
    expected: list[list[float]]
    # Ranks 0 and 1 of the current generation: they never leave (leavers are the highest ranks).
    base: list[str] = field(default_factory=list)
    # The coordinator's settings beyond the harness's (a module's `COORDINATOR_ENV`), at every start.
    env: dict[str, str] = field(default_factory=dict)

    def size(self, deployment: str = "demo") -> int:
        return int(self.coordinator.deployment(deployment)["current_dp_size"])

    def serving_urls(self) -> list[str]:
        return [e["url"] for e in self.coordinator.engines() if e["state"] == "serving"]

    def assert_outputs_correct(self, urls: list[str]) -> None:
        """Every engine's answer equals the single-process computation of the same MoE layer."""
        expected = torch.tensor(self.expected)
        for url in urls:
            response = infer(url, self.tokens)
            assert response.status_code == 200, f"{url}: {response.status_code} {response.text}"
            got = torch.tensor(response.json()["outputs"])
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6), f"{url}: wrong outputs"

    def scale_to(self, target: int, deployment: str = "demo", **fields: Any) -> dict[str, Any]:
        return self.coordinator.wait_job(self.coordinator.scale(target, deployment, **fields))

    def reset(self, size: int = START_SIZE) -> Stack:
        """What every test starts from (see the module docstring); `base` is read afresh."""
        coordinator = self.coordinator
        if not coordinator.alive():
            coordinator.start(ready_timeout_s=60.0, **self.env)
        active = coordinator.deployment()["active_job_id"]
        if active:  # left by a test that failed: end it
            coordinator.api.post(f"/v1/reconfigurations/{active}/cancel")
            coordinator.wait_job(active)
        recent = coordinator.api.get("/v1/reconfigurations", params={"deployment": "demo", "limit": 5})
        for job in recent.json()["data"]:
            if job["cleanup_state"] == "failed":
                coordinator.api.post(f"/v1/reconfigurations/{job['id']}/cleanup/acknowledge")
        if self.size() != size:
            job = self.scale_to(size)
            assert job["state"] == "succeeded", job
        serving = sorted(
            (e for e in coordinator.engines() if e["state"] == "serving"), key=lambda e: e["dp_rank"]
        )
        for engine in serving:  # disarm whatever a failed test left armed
            agent_http.post(f"{engine['url']}/v1/faults", json={}, timeout=5).raise_for_status()
        self.base = [e["url"] for e in serving[:2]]
        return self
