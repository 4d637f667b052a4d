"""The test-only fault switches (`POST /v1/faults`, accepted only with --enable-fault-injection).

Each switch fires once: the step that meets it clears it."""

from __future__ import annotations

import threading

from engine_agent.protocol import FaultInjection, WarmupPolicy
from engine_agent.reconfig.cleanup import CleanupWorker

HANG_POLL_S = 0.02


class FaultSwitches:
    def __init__(self, cleanup: CleanupWorker) -> None:
        self._cleanup = cleanup
        self._lock = threading.Lock()
        self._faults = FaultInjection()
        self._hang_released = threading.Event()

    def inject(self, faults: FaultInjection) -> None:
        """Replace the switches (`release_hang` lets a held step go on, and is not kept)."""
        with self._lock:
            if faults.release_hang:
                self._hang_released.set()
            self._faults = faults.model_copy(update={"release_hang": False})
        if faults.fail_next_cleanup:
            self._cleanup.fail_next()

    @property
    def warmup_policy_override(self) -> WarmupPolicy | None:
        return self._faults.warmup_policy_override

    def at_step(self, step: str) -> tuple[bool, bool]:
        """(fail, hang): whether the step about to run must fail, or be held until released."""
        with self._lock:
            fail = self._faults.fail_prepare_at_step == step
            hang = self._faults.hang_prepare_at_step == step
            if fail:
                self._faults = self._faults.model_copy(update={"fail_prepare_at_step": None})
            if hang:
                self._faults = self._faults.model_copy(update={"hang_prepare_at_step": None})
                self._hang_released.clear()
        return fail, hang

    def hold(self, abort: threading.Event) -> bool:
        """Hold a step until `release_hang` (True) or the job's abort (False)."""
        while not abort.wait(HANG_POLL_S):
            if self._hang_released.is_set():
                return True
        return False

    def take_fail_next_switch(self) -> bool:
        with self._lock:
            fail = self._faults.fail_next_switch
            if fail:
                self._faults = self._faults.model_copy(update={"fail_next_switch": False})
        return fail

    def fail_next_switch_armed(self) -> bool:
        """A switch failure is injected (not taken: the switch that runs takes it)."""
        with self._lock:
            return self._faults.fail_next_switch

    def take_hold_arm(self) -> bool:
        with self._lock:
            hold = self._faults.hold_arm
            if hold:
                self._faults = self._faults.model_copy(update={"hold_arm": False})
        return hold
