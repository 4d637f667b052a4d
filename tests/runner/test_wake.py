"""`app.core.wake`: a ring runs a periodic task at the runner's next turn, not at its interval (issue 34:
a heartbeat reporting a broken group wakes the liveness pass)."""

from __future__ import annotations

import asyncio
import time

from app.backends.base import Periodic
from app.core import wake
from app.runner.scheduled import Scheduled


def test_a_ring_ends_the_bells_wait_and_names_the_task() -> None:
    async def scenario() -> set[str]:
        bell = wake.Bell()
        bell.start()
        try:
            wake.ring(wake.LIVENESS)
            await asyncio.sleep(0)  # the ring is delivered on the bell's loop
            await asyncio.wait_for(bell.wait(3600), 30)  # an hour's sleep ended by the ring
            return bell.take()
        finally:
            bell.close()

    assert asyncio.run(scenario()) == {wake.LIVENESS}


def test_a_closed_bell_hears_nothing() -> None:
    async def scenario() -> set[str]:
        bell = wake.Bell()
        bell.start()
        bell.close()
        wake.ring(wake.LIVENESS)
        await asyncio.sleep(0)
        return bell.take()

    assert asyncio.run(scenario()) == set()


def test_a_woken_task_runs_before_its_interval_and_others_wait() -> None:
    ran: list[str] = []

    def task(name: str) -> Periodic:
        async def run() -> None:
            ran.append(name)

        return Periodic(name, 3600.0, run, last_run=time.monotonic())  # just ran: not due for an hour

    scheduled = Scheduled([task(wake.LIVENESS), task("cleanup")])
    asyncio.run(scheduled.tick())
    assert ran == []
    asyncio.run(scheduled.tick(woken={wake.LIVENESS}))
    assert ran == [wake.LIVENESS]
