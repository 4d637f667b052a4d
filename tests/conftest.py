"""Suite-wide defaults.

In-process coordinator apps (TestClient, ASGI transport) do not run the job runner, so API tests see
jobs stay `pending` until they move them. The runner is exercised in `tests/e2e/` against real
coordinator processes, which set `EPCTL_RUNNER_ENABLED=true` explicitly.

A test that takes `db_backend` (directly, or through `database_url` and the fixtures built on it) runs once
per database its `databases` mark names: SQLite alone unless marked (the rule and its reasons:
`tests/support/databases.py`).
"""

from __future__ import annotations

import os

import pytest

from tests.support.databases import backends_for

os.environ.setdefault("EPCTL_RUNNER_ENABLED", "false")

# The shared fixtures (a database per test, the in-process app and its client; an app served on a port);
# the guard that keeps the `processes` marker true; `--durations-file`.
pytest_plugins = [
    "tests.support.fixtures",
    "tests.support.served",
    "tests.support.process_guard",
    "tests.support.durations",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "databases(*names): the backends this test runs on, of sqlite and postgres (default: sqlite)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("databases")
        # Module scope: a module-scoped stack (tests/e2e) may depend on it as well.
        metafunc.parametrize("db_backend", backends_for(marker.args if marker else None), scope="module")
