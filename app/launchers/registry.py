"""Launchers that drive a cluster engine (Ray), added beside the built-in `local` and `static` ones.

Building them costs nothing and imports no cluster library: the Ray launcher imports `ray` the first
time a `launcher: ray` deployment launches or releases an engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from sqlalchemy.engine import Engine as DbEngine

from app.launchers.base import Launcher


@contextlib.asynccontextmanager
async def cluster_launchers(db: DbEngine) -> AsyncIterator[dict[str, Launcher]]:
    """The cluster launchers by name, shut down (their drivers disconnected) on exit."""
    from app.launchers.ray_launcher import RayLauncher

    launchers: dict[str, Launcher] = {"ray": RayLauncher(db)}
    try:
        yield launchers
    finally:
        for launcher in launchers.values():
            with contextlib.suppress(Exception):
                await launcher.shutdown()
