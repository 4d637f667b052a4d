"""The canary probe of one reference-engine job: started when the job is claimed (a short baseline
first), a phase mark per step, stopped before the job's last transition so that its figures ride on
it. What the probe sees never fails a job: an engine it cannot reach is named on the job
(`probe.unreachable`), and a probe that breaks is logged and left out.

The canaries run on an event loop of their own, in a thread: the coordinator's loop is busy during a
job (launches, long-polls, database writes), and a stall there showed up as client downtime the
engines never had (a background job's 33 ms window measured as a 1.4 s gap during prepare, while an
outside client saw 0.4 s)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from app.probe.canary import CanarySample
from app.probe.figures import BASELINE
from app.probe.record import figures_changes, outage_summary
from app.probe.recorder import CanaryRecorder
from app.probe.reference import ReferenceCanary
from app.probe.settings import ProbeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


class JobProbe:
    def __init__(
        self, settings: ProbeSettings, hidden_size: int, targets: Mapping[str, str], key: str | None = None
    ) -> None:
        """`targets`: engine id -> agent URL of the engines that serve when the job starts; `key`: the
        deployment's agent key (for agents that require a data key on `/v1/infer`)."""
        self.targets = dict(targets)
        self._canary = ReferenceCanary(hidden_size, key)
        interval = settings.interval_for(len(self.targets))
        self.recorder = CanaryRecorder(
            self._canary,
            interval_s=interval,
            timeout_s=settings.timeout_s,
            deadline_s=settings.deadline_s,
        )
        self._baseline_s = settings.baseline_s
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="canary-probe", daemon=True)

    async def _on_probe_loop(self, work: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    @classmethod
    async def open(
        cls, settings: ProbeSettings, hidden_size: int, targets: Mapping[str, str], key: str | None = None
    ) -> JobProbe | None:
        """A started probe (after its baseline), or None when the probe is off or cannot start."""
        if not settings.enabled:
            return None
        try:
            probe = cls(settings, hidden_size, targets, key)
            probe.recorder.set_targets(list(probe.targets.values()))
            probe._thread.start()
            await probe._on_probe_loop(probe.recorder.start())
            probe.mark(BASELINE)
            if probe.targets and probe._baseline_s > 0:
                await asyncio.sleep(probe._baseline_s)
            return probe
        except Exception:
            log.exception("canary probe could not start; the job runs without it")
            return None

    def mark(self, phase: str) -> None:
        self.recorder.mark(phase)

    async def stop(self) -> tuple[dict[str, Any], str] | None:
        """Stop sending; the job's changes (the client outage, the slowest answer, `probe`) and the
        line that announces them, or None when the figures could not be made."""
        try:
            await self._on_probe_loop(self.recorder.stop())
            figures = self.recorder.figures()
            probe = figures.as_dict()
            probe["engines"], probe["unreachable"] = self._per_engine(self.recorder.samples)
            return figures_changes(figures, probe), outage_summary(figures)
        except Exception:
            log.exception("canary probe figures failed; the job goes on without them")
            return None
        finally:
            await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._thread.is_alive():
            self._loop.close()
            return
        try:
            await self._on_probe_loop(self.recorder.stop())
            await self._on_probe_loop(self._canary.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 5.0)
            if not self._thread.is_alive():
                self._loop.close()

    def _per_engine(self, samples: list[CanarySample]) -> tuple[dict[str, Any], dict[str, str]]:
        """Canaries per engine, and the engines some canary could not reach (no HTTP answer at all:
        refused, reset, timed out), with the last reason."""
        engines: dict[str, Any] = {}
        unreachable: dict[str, str] = {}
        for engine_id, url in self.targets.items():
            own = [s for s in samples if s.target == url]
            engines[engine_id] = {"sent": len(own), "failed": sum(1 for s in own if not s.ok)}
            lost = [s for s in own if not s.ok and s.status is None]
            if lost:
                unreachable[engine_id] = lost[-1].detail or "no answer"
        return engines, unreachable
