"""A job's canary probes: the per-engine probe (each engine's own `/v1/infer`: the per-engine figures)
and, where the deployment has a front door, one through it, whose figures are the job's
`client_outage_ms` and `client_slowest_answer_ms`: what a client of the deployment saw (issue 35).
Same interface as one `JobProbe` (`mark`, `stop`, `close`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.probe.job import JobProbe
from app.probe.settings import ProbeSettings

FRONT_DOOR_TARGET = "front-door"


class JobProbes:
    def __init__(self, engines: JobProbe | None, door: JobProbe | None, door_url: str | None) -> None:
        self.engines, self.door, self.door_url = engines, door, door_url

    @classmethod
    async def open(
        cls,
        settings: ProbeSettings,
        hidden_size: int,
        targets: Mapping[str, str],
        key: str | None,
        door_url: str | None,
    ) -> JobProbes | None:
        engines = await JobProbe.open(settings, hidden_size, targets, key)
        door = None
        if door_url is not None:
            door = await JobProbe.open(settings, hidden_size, {FRONT_DOOR_TARGET: door_url}, key)
        if engines is None and door is None:
            return None
        return cls(engines, door, door_url)

    def mark(self, phase: str) -> None:
        for probe in (self.engines, self.door):
            if probe is not None:
                probe.mark(phase)

    async def stop(self) -> tuple[dict[str, Any], str] | None:
        """The job's changes and summary: through the front door when there is one (with the
        per-engine probe's figures under `probe.per_engine`), else the per-engine probe's."""
        engines = await self.engines.stop() if self.engines is not None else None
        door = await self.door.stop() if self.door is not None else None
        if door is None:
            return engines
        changes, summary = door
        probe = {
            **changes["probe"],
            "through": FRONT_DOOR_TARGET,
            "front_door": self.door_url,
            "per_engine": engines[0]["probe"] if engines is not None else None,
        }
        line = f"through the front door: {summary}"
        if engines is not None:
            line += f" (engines directly: {engines[1]})"
        return {**changes, "probe": probe}, line

    async def close(self) -> None:
        for probe in (self.engines, self.door):
            if probe is not None:
                await probe.close()
