"""How a CPU collective is waited (`engine_agent.groups.CommGroup`): in slices, so an abandoned group is
left at once, and never mistaking a slice that ran out for the collective's own failure. A stand-in
for gloo's Work (the race between a slice running out and the collective completing cannot be timed
with real processes)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch

from engine_agent.groups import CollectiveTimeout, CommGroup, GroupAbandoned

SLICE_RAN_OUT = RuntimeError("Operation timed out!")


class StandInWork:
    """Answers `wait` from a script: an exception to raise, or None (done); `is_completed` likewise."""

    def __init__(self, waits: list[BaseException | None], completed: list[bool]) -> None:
        self.waits = waits
        self.completed = completed

    def wait(self, timeout: timedelta) -> bool:
        outcome = self.waits.pop(0)
        if outcome is not None:
            raise outcome
        return True

    def is_completed(self) -> bool:
        return self.completed.pop(0)


class StandInGroup:
    def __init__(self, work: StandInWork) -> None:
        self.work = work

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> StandInWork:
        return self.work


def group(work: StandInWork) -> CommGroup:
    return CommGroup("ep", 3, StandInGroup(work), 0, 2, torch.device("cpu"), timeout_s=5.0)


def test_a_collective_that_ends_just_after_a_slice_ran_out_succeeds() -> None:
    work = StandInWork(waits=[SLICE_RAN_OUT, None], completed=[True])
    group(work).allreduce(torch.zeros(2))  # no error: the slice's timeout is not the collective's


def test_a_collective_that_failed_raises_its_own_error() -> None:
    work = StandInWork(waits=[SLICE_RAN_OUT, RuntimeError("Connection reset by peer")], completed=[True])
    with pytest.raises(CollectiveTimeout, match="Connection reset by peer"):
        group(work).allreduce(torch.zeros(2))


def test_an_abandoned_group_is_left_within_one_slice() -> None:
    work = StandInWork(waits=[SLICE_RAN_OUT, SLICE_RAN_OUT], completed=[False, False])
    comm = group(work)
    comm.abandon("a peer reported it broken")
    with pytest.raises(GroupAbandoned, match="a peer reported it broken"):
        comm.allreduce(torch.zeros(2))  # refused before it starts
    comm.abandoned.clear()
    waits = iter([False])

    def abandon_during_the_wait() -> bool:
        comm.abandon("told while waiting")
        return next(waits)

    work.is_completed = abandon_during_the_wait  # type: ignore[method-assign]
    with pytest.raises(GroupAbandoned, match="told while waiting"):
        comm.allreduce(torch.zeros(2))


GLOO_RESET = RuntimeError(
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:41234: "
    "Connection reset by peer\nThis may indicate a possible application crash on rank 0 or a network "
    "set up issue. GLHF!"
)


def test_a_peer_whose_connection_dropped_is_named_a_lost_peer_not_a_timeout() -> None:
    from engine_agent.groups import PeerLost
    from engine_agent.reconfig.errors import agent_error_of

    work = StandInWork(waits=[SLICE_RAN_OUT, GLOO_RESET], completed=[True])
    with pytest.raises(PeerLost, match="a peer left or died") as raised:
        group(work).allreduce(torch.zeros(2))
    assert "Connection reset by peer" in str(raised.value) and "GLHF" not in str(raised.value)
    error = agent_error_of(raised.value, "commit")
    assert error.type == "peer-lost", error


def test_a_collective_past_its_deadline_stays_a_timeout() -> None:
    from engine_agent.reconfig.errors import agent_error_of

    work = StandInWork(waits=[SLICE_RAN_OUT, RuntimeError("Timed out waiting 5000ms")], completed=[True])
    with pytest.raises(CollectiveTimeout) as raised:
        group(work).allreduce(torch.zeros(2))
    assert agent_error_of(raised.value, "commit").type == "collective-timeout"
