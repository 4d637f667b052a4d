"""Test hosts for `tests/hosts/` (marker `hosts`): skipped, saying why, where network namespaces cannot
be made (not root, no `ip`, `ip netns add` refused)."""

from __future__ import annotations

import pytest

from tests.support.netns import unavailable

_REASON = unavailable()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/hosts/" in item.nodeid:
            item.add_marker(pytest.mark.hosts)
            if _REASON is not None:
                item.add_marker(pytest.mark.skip(reason=f"no test hosts: {_REASON}"))
