"""A broken serving group cannot hold its members hostage: when a peer dies, every survivor leaves the
group at once (the first to see it tells the others: gloo cannot abort a collective in flight, and a
survivor whose ring neighbours are alive would otherwise sit out its whole deadline); a peer that
stalls breaks the generation at the serving deadline. Real agent processes on loopback.

The deadlines here are far longer than the tests' waits, so only the behaviour under test can end
the wait in time (no timing is asserted)."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from engine_agent.protocol import AgentState, Timeouts
from tests.agent.driver import AgentProcess, Driver, assert_serves_reference
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]

# Only the notice (or the serving deadline, where a test sets it short) can end a survivor's wait.
LONG = Timeouts(rendezvous_s=20, collective_s=300, serving_collective_s=300, transfer_s=20, pause_lease_s=10)


def left_their_group(agents: list[AgentProcess]) -> bool:
    return all((info.state, info.generation) == (AgentState.idle, 0) for info in (a.info() for a in agents))


def test_every_survivor_leaves_at_once_when_a_peer_dies(spawn_agents: Spawn) -> None:
    agents = spawn_agents(4)
    driver = Driver(timeouts=LONG)
    driver.reconfigure(agents)
    assert_serves_reference(agents)
    agents[3].process.kill()
    wait_until(lambda: left_their_group(agents[:3]), timeout_s=60, what="every survivor idle", interval_s=0.2)
    # The broken group is gone for good; the survivors form a new generation of their own.
    driver.members, driver.generation, driver.placement = [], 0, []
    driver.reconfigure(agents[:3])
    assert_serves_reference(agents[:3])


def test_a_stalled_peer_breaks_the_generation_at_the_serving_deadline(spawn_agents: Spawn) -> None:
    agents = spawn_agents(3)
    driver = Driver(timeouts=LONG.model_copy(update={"serving_collective_s": 1.0}))
    driver.reconfigure(agents)
    assert_serves_reference(agents)
    agents[2].process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: left_their_group(agents[:2]), timeout_s=60, what="the others idle", interval_s=0.2)
    finally:
        agents[2].process.send_signal(signal.SIGCONT)
    # Thawed, it finds its group broken too: no member serves the old generation any more.
    wait_until(lambda: left_their_group(agents), timeout_s=60, what="the thawed engine idle", interval_s=0.2)


# Every expert on two engines: the loss of any one leaves every expert served.
COVERED = [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 4, 5], [2, 3, 6, 7]]


class CoveringDriver(Driver):
    """Places as `COVERED` (its first rows, for fewer engines)."""

    def plan(self, new_members: list[AgentProcess]) -> list[list[int]]:
        return COVERED[: len(new_members)]


def test_the_survivors_re_form_from_the_rows_they_kept(spawn_agents: Spawn) -> None:
    agents = spawn_agents(4)
    driver = CoveringDriver(timeouts=LONG)
    driver.reconfigure(agents)
    agents[3].process.kill()
    wait_until(lambda: left_their_group(agents[:3]), timeout_s=60, what="every survivor idle", interval_s=0.2)
    kept = [a.info().resident for a in agents[:3]]
    assert [(r.generation, r.rank, r.placements) for r in kept if r] == [(1, i, [COVERED]) for i in range(3)]
    # The new generation's rows are the ones they hold: nothing loads from the checkpoint or the network.
    driver.members, driver.placement = [], []
    outcome = driver.reconfigure(agents[:3])
    for engine_id, status in outcome.statuses.items():
        loaded = (status.bytes_loaded, status.bytes_received, status.transfer_backend)
        assert loaded == (0, 0, None), engine_id
        assert status.bytes_resident == status.bytes_moved == status.bytes_total > 0, engine_id
    assert_serves_reference(agents[:3])
    assert all(a.info().resident is None for a in agents[:3])  # dropped once the new generation serves
