"""One real stack per test module and database: a uvicorn coordinator (job runner on) on a fresh SQLite
file or Postgres schema, a deployment `demo` of two local reference engines, and its cleanup."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_agent import moe
from tests.e2e.harness import ENGINE, Coordinator, infer
from tests.support.databases import postgres_schema, postgres_unavailable_reason, sqlite_database

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@dataclass
class Stack:
    backend: str
    coordinator: Coordinator
    tokens: list[list[float]]
    expected: list[list[float]]
    jobs: list[dict[str, Any]] = field(default_factory=list)
    # Ranks 0 and 1 of the first generation: they never leave (leavers are the highest ranks).
    base: list[str] = field(default_factory=list)

    def size(self) -> int:
        return int(self.coordinator.deployment()["current_dp_size"])

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

    def scale_to(self, target: int, **fields: Any) -> dict[str, Any]:
        job = self.coordinator.wait_job(self.coordinator.scale(target, **fields))
        self.jobs.append(job)
        return job


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    backend = str(request.param)
    tmp = tmp_path_factory.mktemp(f"e2e-{backend}")
    with _database(backend, tmp) as url:
        coordinator = Coordinator(url, tmp / "data")
        try:
            coordinator.start()
            coordinator.create_deployment("demo")
            first = coordinator.wait_job(coordinator.scale(2))
            assert first["state"] == "succeeded", first
            tokens = torch.randn(6, ENGINE.hidden_size, generator=torch.Generator().manual_seed(7))
            stack = Stack(
                backend=backend,
                coordinator=coordinator,
                tokens=tokens.tolist(),
                expected=moe.reference_forward(ENGINE, tokens).tolist(),
                jobs=[first],
                base=[m["url"] for m in coordinator.members(first)],
            )
            yield stack
        finally:
            coordinator.close()


class _database:
    """A migrated SQLite file or Postgres schema for one module (A's isolation helpers)."""

    def __init__(self, backend: str, tmp: Path) -> None:
        self.backend = backend
        self.tmp = tmp
        self._schema: Any = None

    def __enter__(self) -> str:
        if self.backend == "sqlite":
            return sqlite_database(self.tmp, migrated=True)
        reason = postgres_unavailable_reason()
        if reason is not None:
            pytest.skip(reason)
        self._schema = postgres_schema(migrated=True)
        return str(self._schema.__enter__())

    def __exit__(self, *exc: object) -> None:
        if self._schema is not None:
            self._schema.__exit__(None, None, None)
