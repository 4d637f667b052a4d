"""The engine's standing NIXL agent: built once, at the agent's start (off the serving path), and lent
to one weight channel at a time, so that opening a channel no longer builds an agent (and closing one no
longer destroys it) while the EP group serves beside a background prepare.

On this 2-core machine building an agent and destroying it each held the engine's interpreter for
0.05-0.3 s (destroying ~0.1 s even when idle: the destructor holds the GIL), and every serving step
is a collective of the whole group, so one engine's stall was every client's.

The rules (`lends`, `keeps`) are pure; `StandingAgent` holds the agent and applies them:
- a channel gets the standing agent when one is held, not lent already, on a CPU engine, with the
  number of UCX workers the channel reads with; otherwise it builds its own, as before;
- at a clean close (every transfer succeeded, every remote agent removed, every region deregistered)
  the agent comes back; an agent that saw a failure is dropped, so no stale remote entry or
  registration outlives its channel; a clean channel-built agent becomes the standing one when none
  is held (after a failure dropped the last).

The standing agent keeps one name for its life; peers key remote agents by that name, and every
channel's close removes them (an unclean close drops the agent instead), so re-adding the same name in
the next channel finds no stale entry (NIXL's disconnect is local: nothing reaches the peer).

CUDA engines keep one agent per channel: UCX picks its GPU transports when the agent's workers are
built, which needs the CUDA context, and the probe's agent predates it; a standing agent for CUDA
(built after the engine's weights are on the device, with a VRAM scrap) is left for a host where
NIXL over device memory can be tested. `EPCTL_NIXL_STANDING_AGENT=0` turns the standing agent off.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from collections.abc import Mapping

import torch

from engine_agent.transfer.nixl_agent import AgentLease, default_read_threads, drop_lease, probe_nixl

STANDING_ENV = "EPCTL_NIXL_STANDING_AGENT"


def standing_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(STANDING_ENV, "1").strip().lower() not in {"0", "false", "no", "off"}


def lends(*, held: bool, lent: bool, device_type: str, workers: int, held_workers: int) -> bool:
    """Whether a channel opened now borrows the standing agent (else it builds its own)."""
    return held and not lent and device_type == "cpu" and workers == held_workers


def keeps(
    *, standing: bool, clean: bool, held: bool, device_type: str, workers: int, wanted_workers: int
) -> bool:
    """Whether a closing channel's agent is kept as the standing agent (else it is dropped).
    `standing`: it was lent by the standing agent; `held`: the standing slot is taken (by it, if lent)."""
    if not clean:
        return False
    if standing:
        return True
    return not held and device_type == "cpu" and workers == wanted_workers


class StandingAgent:
    """At most one standing agent per process, lent to one channel at a time (thread-safe)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self._lock = threading.Lock()
        self._enabled = enabled
        self._held: AgentLease | None = None
        self._lent = False
        self._owner = os.getpid()

    @property
    def enabled(self) -> bool:
        return standing_enabled() if self._enabled is None else self._enabled

    def held(self) -> AgentLease | None:
        return self._held

    def offer(self, lease: AgentLease) -> bool:
        """Keep a clean, idle agent (the start-up probe's) as the standing one; False: not taken."""
        with self._lock:
            if not self.enabled or self._held is not None or lease.device_type != "cpu":
                return False
            lease.standing = False
            self._held, self._lent = lease, False
            return True

    def borrow(self, device: torch.device, workers: int) -> AgentLease | None:
        with self._lock:
            held = self._held
            if held is None or not self.enabled or os.getpid() != self._owner:
                return None
            lent = self._lent
            if not lends(
                held=True,
                lent=lent,
                device_type=device.type,
                workers=workers,
                held_workers=held.workers,
            ):
                return None
            self._lent = True
            held.standing = True
            return held

    def give_back(self, lease: AgentLease, *, clean: bool) -> None:
        """A channel's close: keep the agent as the standing one, or drop it (see `keeps`)."""
        with self._lock:
            kept = self.enabled and keeps(
                standing=lease.standing,
                clean=clean,
                held=self._held is not None,
                device_type=lease.device_type,
                workers=lease.workers,
                wanted_workers=default_read_threads(),
            )
            if lease.standing:
                self._held, self._lent = None, False
            if kept:
                lease.standing = False
                self._held, self._lent = lease, False
        if not kept:
            drop_lease(lease)

    def retire(self) -> None:
        """Drop the standing agent unless a channel holds it (at exit, or on an engine that has no use)."""
        with self._lock:
            lease = self._held if not self._lent else None
            if lease is not None:
                self._held = None
        if lease is not None and os.getpid() == self._owner:
            drop_lease(lease)

    def forget_after_fork(self) -> None:
        """In a forked child: the agent's threads stayed in the parent. Never use it nor run its
        destructor (which would join threads that do not exist here): leak it on purpose."""
        lease, self._held, self._lent = self._held, None, False
        self._lock, self._owner = threading.Lock(), os.getpid()  # a forked agent may stand its own
        if lease is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(lease.agent))


STANDING = StandingAgent()
atexit.register(STANDING.retire)
os.register_at_fork(after_in_child=STANDING.forget_after_fork)


def start_standing_agent(device: torch.device) -> bool:
    """At the engine agent's start, off the serving path: probe NIXL and keep the probe's agent as the
    standing one when this engine's channels can use it (a CPU engine, not turned off). Returns
    whether a standing agent is held."""
    if device.type != "cpu" or not STANDING.enabled:
        return False
    probe_nixl(keep=STANDING.offer)
    return STANDING.held() is not None
