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


# The `processes` marker (pyproject.toml; kept true by tests/support/process_guard.py): a test that
# starts a process itself carries it in its module; one that gets its processes from a fixture is
# marked here, by the fixture it uses (directly or through another), and every test of these folders.
PROCESS_FOLDERS = ("tests/e2e/", "tests/hosts/", "tests/ray/")
PROCESS_FIXTURES = {
    "tests.agent.test_agent_announce.coordinator",
    "tests.agent.test_agent_auth.plane",
    "tests.agent.test_infer_binary.serving",
    "tests.cli.conftest.coordinator",
    "tests.cli.test_scale_local.local_demo",
    "tests.operators.test_job_events.live",
    "tests.operators.test_kubernetes_client.coordinator",
    "tests.operators.test_real_clients.coordinator",
    "tests.support.fixtures.agent_zygote",
    "tests.ui.conftest.browser",
    "tests.ui.conftest.coordinator",
    "tests.vllm.conftest.standin",
    "tests.vllm.conftest.tiny_model",
    "tests.vllm.test_vllm_real.coordinator",
    "tests.vllm.test_vllm_standin.coordinator",
}


def _uses_a_process_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in item.fixturenames:  # type: ignore[attr-defined]
        definitions = info.name2fixturedefs.get(name)
        if definitions:
            func = definitions[-1].func  # the definition in effect for this test
            if f"{func.__module__}.{func.__name__}" in PROCESS_FIXTURES:
                return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(PROCESS_FOLDERS) or _uses_a_process_fixture(item):
            item.add_marker(pytest.mark.processes)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("databases")
        # Module scope: a module-scoped stack (tests/e2e) may depend on it as well.
        metafunc.parametrize("db_backend", backends_for(marker.args if marker else None), scope="module")
