from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.job_driver import run_coordinator
from tests.support.processes import Coordinator

_names = itertools.count()


@pytest.fixture(scope="package")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coordinator]:
    """One real coordinator for the CLI tests, job runner off: the tests move jobs themselves, each on
    a deployment of its own (`deployment_name`), so they share it as users share a coordinator."""
    tmp_dir: Path = tmp_path_factory.mktemp("coordinator")
    with run_coordinator(tmp_dir, EPCTL_RUNNER_ENABLED="false") as process:
        yield process


@pytest.fixture
def api(coordinator: Coordinator) -> Iterator[httpx.Client]:
    with coordinator.client() as client:
        yield client


@pytest.fixture
def deployment_name() -> str:
    """A fresh name per test: each test owns its deployment (one active job per deployment)."""
    return f"dep-{next(_names)}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "agents: starts real local agent processes (select with -m agents)")
