"""The e2e stack: a uvicorn coordinator (job runner on) on a fresh SQLite file or Postgres schema, and a
deployment `demo` of local reference engines, shared by the tests of a module and backend (starting
agents is the slow part).

Every test states what it starts from: the `stack` fixture brings the shared deployment back to two
engines serving one generation, with the coordinator running, no job active, no cleanup failure
pending and no fault armed. So any test passes alone or in any order; a test that breaks the
deployment beyond that (a switch failing part-way) makes a deployment of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine_agent import moe
from tests.support.databases import module_database
from tests.support.e2e import Stack
from tests.support.stack import ENGINE, StackCoordinator

__all__ = ["Stack", "shared_stack", "stack"]


@pytest.fixture(scope="module")
def shared_stack(
    db_backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """A test module may set `COORDINATOR_ENV` (settings for every start of its coordinator)."""
    tmp = tmp_path_factory.mktemp(f"e2e-{db_backend}")
    env: dict[str, str] = dict(getattr(request.module, "COORDINATOR_ENV", {}))
    with module_database(db_backend, tmp) as url:
        coordinator = StackCoordinator(url, tmp / "data")
        try:
            coordinator.start(ready_timeout_s=60.0, **env)
            coordinator.create_deployment("demo")
            tokens = torch.randn(6, ENGINE.hidden_size, generator=torch.Generator().manual_seed(7))
            yield Stack(
                backend=db_backend,
                coordinator=coordinator,
                tokens=tokens.tolist(),
                expected=moe.reference_forward(ENGINE, tokens).tolist(),
                env=env,
            )
        finally:
            coordinator.close()


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """The module's stack at two serving engines, whatever the test before it left."""
    return shared_stack.reset()
