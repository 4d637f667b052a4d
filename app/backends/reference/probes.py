"""A job's canary probes: the per-engine probe (each engine's own `/v1/infer`: the per-engine figures)
and, where the deployment has a front door, one through it, whose figures are the job's
`client_outage_ms` and `client_slowest_answer_ms`: what a client of the deployment saw (issue 35).
Same interface as one `JobProbe` (`mark`, `stop`, `close`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from app.backends.reference.job import JobRun
from app.backends.reference.record import JobRecord
from app.deployments.front_door import FrontDoor
from app.frontdoor.keeper import accounting, by_sender, counters_of, held_of, senders_of
from app.probe.job import JobProbe
from app.probe.settings import ProbeSettings

FRONT_DOOR_TARGET = "front-door"


class JobProbes:
    def __init__(self, engines: JobProbe | None, door: JobProbe | None, door_url: str | None) -> None:
        self.engines, self.door, self.door_url = engines, door, door_url
        self.deployment_id: str | None = None
        self.counters_at_start: dict[str, Any] | None = None  # the front door's, when the job started
        self.senders_at_start: dict[str, Any] | None = None  # its requests by sender then
        self.drained: Callable[[], Awaitable[dict[str, Any] | None]] | None = None

    @classmethod
    async def open(
        cls,
        settings: ProbeSettings,
        hidden_size: int,
        targets: Mapping[str, str],
        key: str | None,
        door_url: str | None,
        deployment_id: str | None = None,
        drained: Callable[[], Awaitable[dict[str, Any] | None]] | None = None,
    ) -> JobProbes | None:
        """`drained`: reads what the job's drain step measured (`front_door_requests.drained`)."""
        engines = await JobProbe.open(settings, hidden_size, targets, key)
        door = None
        if door_url is not None:
            door = await JobProbe.open(settings, hidden_size, {FRONT_DOOR_TARGET: door_url}, key)
        if engines is None and door is None:
            return None
        probes = cls(engines, door, door_url)
        if door_url is not None and deployment_id is not None:
            probes.deployment_id, probes.drained = deployment_id, drained
            probes.senders_at_start = await senders_of(deployment_id)
            probes.counters_at_start = await counters_of(deployment_id)
        return probes

    async def requests(self, run: JobRun | None = None) -> dict[str, Any] | None:
        """The job's request accounting at the front door (None: not measured); `run`: its commit
        window, for the requests held in it."""
        if self.deployment_id is None or self.counters_at_start is None:
            return None
        end = await counters_of(self.deployment_id)
        if end is None:
            return None
        senders = await senders_of(self.deployment_id)
        counted = accounting(self.counters_at_start, end)
        # Clients' requests apart from our canaries' (read around the counters: the span they count).
        counted["by_sender"] = by_sender(self.senders_at_start, senders)
        if run is not None and run.plan is not None:
            window = run.downtime()
            counted["held"] = held_of(self.deployment_id, window.window_start, window.window_end)
        earlier = await self.drained() if self.drained is not None else None
        counted["drained"] = (earlier or {}).get("drained", {})
        return counted

    def mark(self, phase: str) -> None:
        for probe in (self.engines, self.door):
            if probe is not None:
                probe.mark(phase)

    async def stop(self, run: JobRun | None = None) -> tuple[dict[str, Any], str] | None:
        """The job's changes and summary: through the front door when there is one (with the
        per-engine probe's figures under `probe.per_engine`), else the per-engine probe's."""
        engines = await self.engines.stop() if self.engines is not None else None
        door = await self.door.stop() if self.door is not None else None
        if door is None:
            return engines
        changes, summary = door
        requests = await self.requests(run)
        if requests is not None:
            changes = {**changes, "front_door_requests": requests}
            failed = sum(requests["failed"].values())
            senders = requests.get("by_sender")
            clients = ""
            if senders:
                mine, ours = senders["clients"]["requests"], senders["canaries"]["requests"]
                clients = f" ({mine} from clients, {ours} canaries)"
            summary += (
                f"; front door: {requests['requests']} requests{clients}, {failed} failed, "
                f"{requests['retried']} retried"
            )
            held = requests.get("held")
            if held:
                longest = held["longest_wait_ms"]
                summary += f", {held['count']} held in the window" + (
                    f" (longest {longest:.0f} ms)" if longest is not None else ""
                )
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


async def open_job_probes(
    record: JobRecord, settings: ProbeSettings, run: JobRun, targets: Mapping[str, str]
) -> JobProbes | None:
    """The job's probes: per engine (`targets`), and through the deployment's front door if it has one."""
    door = await record.run_in_session(lambda session: session.get(FrontDoor, run.deployment_id))

    async def drained() -> dict[str, Any] | None:
        job = await record.job(run.job_id)
        return job.front_door_requests

    return await JobProbes.open(
        settings,
        run.engine_config.hidden_size,
        targets,
        run.agent_keys[0] if run.agent_keys else None,
        door.url if door is not None else None,
        run.deployment_id,
        drained,
    )
