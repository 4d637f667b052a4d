"""The engine's standing NIXL agent (`engine_agent.transfer.nixl_standing`): lent to one channel at a
time, given back at a clean close, dropped after a failure, and a clean channel-built agent taking the
empty slot; the rules as tables, the slot with stand-in agents, then real NIXL channels in this process
reusing their standing agents round after round (a peer re-adding the same agent name after removing
it) and a failed open dropping the lent agent."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.distributed as dist

from engine_agent.placement import TransferItem
from engine_agent.protocol import TransferBackend
from engine_agent.transfer import TransferAborted, available_backends, open_channel
from engine_agent.transfer import nixl as nixl_channel
from engine_agent.transfer.nixl_agent import AgentLease, default_read_threads, new_lease
from engine_agent.transfer.nixl_standing import STANDING_ENV, StandingAgent, keeps, lends, standing_enabled

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(
    ("held", "lent", "device_type", "workers", "held_workers", "expected"),
    [
        (True, False, "cpu", 2, 2, True),  # free, same device kind and workers: lent
        (False, False, "cpu", 2, 2, False),  # none held (NIXL off, or dropped after a failure)
        (True, True, "cpu", 2, 2, False),  # a second channel while the first holds it: its own agent
        (True, False, "cuda", 2, 2, False),  # CUDA channels build their agent after the CUDA context
        (True, False, "cpu", 3, 2, False),  # a channel reading with more workers than the agent has
        (True, False, "cpu", 1, 2, False),
    ],
)
def test_a_channel_borrows_the_standing_agent_only_when_it_is_free_and_fits(
    held: bool, lent: bool, device_type: str, workers: int, held_workers: int, expected: bool
) -> None:
    rule = lends(held=held, lent=lent, device_type=device_type, workers=workers, held_workers=held_workers)
    assert rule is expected


@pytest.mark.parametrize(
    ("standing", "clean", "held", "device_type", "workers", "expected"),
    [
        (True, True, True, "cpu", 2, True),  # the lent agent comes back after a clean close
        (True, False, True, "cpu", 2, False),  # after a failure it is dropped: no stale entry survives
        (False, True, False, "cpu", 2, True),  # a clean channel-built agent fills the empty slot
        (False, True, True, "cpu", 2, False),  # ... not a taken one (two channels at once)
        (False, False, False, "cpu", 2, False),
        (False, True, False, "cuda", 2, False),
        (False, True, False, "cpu", 3, False),  # workers other than the default channel's
    ],
)
def test_a_closing_channel_keeps_its_agent_only_when_clean(
    standing: bool, clean: bool, held: bool, device_type: str, workers: int, expected: bool
) -> None:
    rule = keeps(
        standing=standing, clean=clean, held=held, device_type=device_type, workers=workers, wanted_workers=2
    )
    assert rule is expected


@pytest.mark.parametrize(
    ("value", "expected"), [(None, True), ("1", True), ("0", False), ("false", False), ("off", False)]
)
def test_the_standing_agent_is_on_unless_turned_off(value: str | None, expected: bool) -> None:
    assert standing_enabled({} if value is None else {STANDING_ENV: value}) is expected


@dataclass
class FakeAgent:
    deregistered: list[Any] = field(default_factory=list)

    def deregister_memory(self, registration: Any) -> None:
        self.deregistered.append(registration)


def fake_lease(name: str, workers: int | None = None, device_type: str = "cpu") -> AgentLease:
    workers = default_read_threads() if workers is None else workers
    return AgentLease(FakeAgent(), name, workers, device_type, torch.empty(1), f"scrap-of-{name}")


def test_the_slot_lends_one_channel_at_a_time_and_takes_the_agent_back() -> None:
    slot = StandingAgent(enabled=True)
    standing = fake_lease("standing")
    assert slot.offer(standing)
    workers = standing.workers
    first = slot.borrow(CPU, workers)
    assert first is standing and first.standing
    assert slot.borrow(CPU, workers) is None  # lent: a second channel builds its own
    slot.give_back(standing, clean=True)
    assert slot.held() is standing and not standing.standing
    assert slot.borrow(CPU, workers) is standing  # the next channel gets the same agent (and name)
    assert standing.agent.deregistered == []  # its scrap stays registered for its life


def test_a_failed_channel_drops_the_lent_agent_and_a_clean_one_takes_the_slot() -> None:
    slot = StandingAgent(enabled=True)
    standing = fake_lease("standing")
    slot.offer(standing)
    agent = standing.agent
    lent = slot.borrow(CPU, standing.workers)
    assert lent is not None
    slot.give_back(lent, clean=False)
    assert slot.held() is None and agent.deregistered == ["scrap-of-standing"] and lent.agent is None
    assert slot.borrow(CPU, standing.workers) is None  # nothing to lend: the channel builds its own
    own = fake_lease("a/0123")
    slot.give_back(own, clean=True)
    assert slot.held() is own  # a clean channel-built agent is the standing one now
    other = fake_lease("a/4567")
    slot.give_back(other, clean=True)
    assert slot.held() is own and other.agent is None  # the slot was taken: dropped


def test_the_slot_lends_nothing_to_cuda_channels_nor_when_turned_off() -> None:
    slot = StandingAgent(enabled=True)
    standing = fake_lease("standing")
    slot.offer(standing)
    assert slot.borrow(CUDA, standing.workers) is None
    assert slot.borrow(CPU, standing.workers + 1) is None
    assert not StandingAgent(enabled=False).offer(fake_lease("off"))
    assert not StandingAgent(enabled=True).offer(fake_lease("gpu", device_type="cuda"))


def test_retiring_drops_an_idle_agent_but_never_a_lent_one() -> None:
    slot = StandingAgent(enabled=True)
    standing = fake_lease("standing")
    slot.offer(standing)
    slot.borrow(CPU, standing.workers)
    slot.retire()
    assert standing.agent is not None  # a channel is using it
    slot.give_back(standing, clean=True)
    slot.retire()
    assert slot.held() is None and standing.agent is None


def test_a_forked_child_forgets_the_agent_whose_threads_stayed_in_the_parent() -> None:
    slot = StandingAgent(enabled=True)
    standing = fake_lease("standing")
    slot.offer(standing)
    slot.forget_after_fork()
    assert slot.held() is None and slot.borrow(CPU, standing.workers) is None
    assert standing.agent.deregistered == []  # never touched (its destructor never runs there)
    own = fake_lease("child")
    assert slot.offer(own) and slot.borrow(CPU, own.workers) is own  # the child may stand its own


NIXL = pytest.mark.skipif(TransferBackend.nixl not in available_backends(), reason="NIXL is unavailable")


class PerEngine:
    """Stands in for the process's slot: one standing agent per engine thread, as each engine process
    has its own."""

    def __init__(self, slots: dict[str, StandingAgent]) -> None:
        self.slots = slots
        self.lent: list[str] = []  # the names of the agents lent, in order

    def borrow(self, device: torch.device, workers: int) -> AgentLease | None:
        lease = self.slots[threading.current_thread().name].borrow(device, workers)
        if lease is not None:
            self.lent.append(lease.name)
        return lease

    def give_back(self, lease: AgentLease, *, clean: bool) -> None:
        self.slots[threading.current_thread().name].give_back(lease, clean=clean)


def expert(index: int) -> torch.Tensor:
    return torch.randn(70_001, generator=torch.Generator().manual_seed(index))


def run_round(
    store: dist.Store, generation: int, plan: list[TransferItem], engines: list[str]
) -> dict[str, Any]:
    """Every engine (a thread named after it) opens a channel, runs `plan`, closes; returns what each
    received, or the error it raised."""
    outcome: dict[str, Any] = {}

    def engine(me: str) -> None:
        try:
            channel = open_channel(
                TransferBackend.nixl,
                engine_id=me,
                participants=engines,
                store=dist.PrefixStore(f"gen{generation}", store),
                device=CPU,
                timeout_s=60,
            )
            try:
                sources = {i.logical_expert: expert(i.logical_expert) for i in plan if i.src == me}
                destinations = {i.logical_expert: torch.zeros(70_001) for i in plan if i.dst == me}
                channel.transfer(plan, sources, destinations)
                outcome[me] = destinations
            finally:
                channel.close()
        except Exception as error:
            outcome[me] = error

    threads = [threading.Thread(target=engine, args=(me,), name=me) for me in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return outcome


@NIXL
def test_channels_reuse_each_engines_standing_agent_round_after_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slots = {me: StandingAgent(enabled=True) for me in ("a", "b")}
    for me, slot in slots.items():
        assert slot.offer(new_lease(f"standing-{me}", default_read_threads(), CPU))
    names = {me: slot.held().name for me, slot in slots.items()}  # type: ignore[union-attr]
    lender = PerEngine(slots)
    monkeypatch.setattr(nixl_channel, "STANDING", lender)
    store = dist.HashStore()
    # Both ways and back: each agent reads from, and serves to, a peer it removed at the last close.
    for generation, (src, dst) in enumerate([("a", "b"), ("b", "a"), ("a", "b")]):
        outcome = run_round(store, generation, [TransferItem(generation, src, dst)], ["a", "b"])
        assert torch.equal(outcome[dst][generation], expert(generation)), outcome
        assert sorted(lender.lent) == sorted(names.values()), lender.lent  # each channel used its engine's
        assert {me: slot.held().name for me, slot in slots.items()} == names  # type: ignore[union-attr]
        lender.lent.clear()
    for slot in slots.values():
        slot.retire()


@NIXL
def test_an_aborted_open_drops_the_lent_agent_and_the_next_clean_channel_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slot = StandingAgent(enabled=True)
    assert slot.offer(new_lease("standing-a", default_read_threads(), CPU))
    other = StandingAgent(enabled=True)
    monkeypatch.setattr(nixl_channel, "STANDING", PerEngine({"a": slot, "b": other}))
    abort = threading.Event()
    abort.set()
    failed: list[BaseException] = []

    def open_with_a_ghost() -> None:
        try:
            open_channel(
                TransferBackend.nixl,
                engine_id="a",
                participants=["a", "ghost"],
                store=dist.HashStore(),
                device=CPU,
                timeout_s=60,
                abort=abort,
            )
        except BaseException as error:  # asserted below
            failed.append(error)

    opener = threading.Thread(target=open_with_a_ghost, name="a")
    opener.start()
    opener.join(timeout=60)
    assert failed and isinstance(failed[0], TransferAborted), failed
    assert slot.held() is None  # the agent that saw the failure is gone
    outcome = run_round(dist.HashStore(), 0, [TransferItem(0, "b", "a")], ["a", "b"])
    assert torch.equal(outcome["a"][0], expert(0)), outcome
    held = slot.held()
    assert held is not None and held.name.startswith("a/")  # built by that channel, standing now
    slot.retire()
    other.retire()
