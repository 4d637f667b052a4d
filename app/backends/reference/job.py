"""One running job as the reference flow holds it in memory (`JobRun`). The failures that end it are
every backend's (`app.backends.base`).

Pure: no database, no HTTP. The record (`record.py`) writes what is derived here (engine results,
downtime) onto the job.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.agents.client import AgentClient
from app.backends.reference.downtime import Downtime, job_downtime
from app.backends.reference.planner import Plan
from app.jobs.states import JobState
from app.launchers.base import EngineHandle
from engine_agent.protocol import (
    AgentInfo,
    CommitMode,
    EngineConfig,
    ReconfigStatus,
    Strategy,
)

# Progress bands per phase: percent = start + (end - start) * fraction done.
PROGRESS_BANDS: Mapping[str, tuple[float, float]] = {
    "launching": (0.0, 10.0),
    "preparing": (10.0, 60.0),
    "syncing": (60.0, 70.0),
    "pausing": (70.0, 80.0),
    "switching": (80.0, 90.0),
    "cleaning_up": (90.0, 100.0),
}

# The generation a job ended on, for its per-engine results (see `JobRun.engine_results`).
EndedOn = Literal["new", "old"]


@dataclass
class JobRun:
    job_id: str
    deployment_id: str
    deployment_name: str
    launcher_name: str
    engine_config: EngineConfig
    state: JobState
    strategy: Strategy
    warmup_requested: str | None
    commit_mode: CommitMode = CommitMode.coordinator
    max_downtime_ms: int | None = None  # the downtime budget in force
    retire: tuple[str, ...] = ()  # the engines the request names to leave
    all_or_nothing: bool = False  # a grow short of engines fails (else: commits what it reached)
    # The deployment's agent keys (current first), sent on every agent call; not in a repr (logs).
    agent_keys: tuple[str, ...] = field(default=(), repr=False)
    # When the previous key's overlap ends (epoch seconds; None: no previous key): engines launched
    # during the overlap get it with the key, so it ends on them too.
    agent_key_previous_until: float | None = None
    launch_timeout_s: float | None = None  # the deployment's launch readiness timeout (None: adaptive)
    plan: Plan | None = None
    clients: dict[str, AgentClient] = field(default_factory=dict)
    statuses: dict[str, ReconfigStatus] = field(default_factory=dict)
    infos: dict[str, AgentInfo] = field(default_factory=dict)
    launched: list[EngineHandle] = field(default_factory=list)
    # Participants that did not answer a call within its deadline, or could not be reached, in this job
    # (`app.agents.errors.is_silence`): an abort does not wait for them.
    silent: set[str] = field(default_factory=set)
    progress_step: str | None = None
    progress_percent: float = 0.0
    # Coordinator-side timing of the commit window (monotonic seconds), to show where downtime goes.
    commit_marks: dict[str, float] = field(default_factory=dict)
    # The rank set the front door is given at the observed commit, derived before the window
    # (`front_door.prederive`): a task, or None where there is nothing to give it ahead.
    rank_set_ahead: Any = None

    def mark(self, name: str) -> None:
        self.commit_marks[name] = time.monotonic()

    def commit_timing_ms(self) -> dict[str, float]:
        marks = self.commit_marks
        spans = {
            # Engine-agreed: the coordinator only arms and observes; its time inside the window is 0.
            "arm_to_all_committed_ms": ("arm_sent", "all_committed"),
            "pause_confirm_ms": ("pause_sent", "all_paused"),
            "paused_to_switch_sent_ms": ("all_paused", "switch_sent"),
            "switch_confirm_ms": ("switch_sent", "all_committed"),
        }
        timing = {
            name: round((marks[b] - marks[a]) * 1000.0, 3)
            for name, (a, b) in spans.items()
            if a in marks and b in marks
        }
        if "arm_sent" in marks:
            timing["inside_window_ms"] = 0.0  # by construction: nothing is sent once the engines armed
        return timing

    def participant_clients(self) -> list[AgentClient]:
        assert self.plan is not None
        return [self.clients[m.engine_id] for m in self.plan.participants]

    def member_clients(self) -> list[AgentClient]:
        assert self.plan is not None
        return [self.clients[m.engine_id] for m in self.plan.members]

    def joiner_handles(self) -> list[EngineHandle]:
        """Engines this job launched or planned to add: what a rollback gives back to the launcher."""
        handles = list(self.launched)
        if self.plan is not None:
            known = {h.engine_id for h in handles}
            handles += [
                self._handle(m.engine_id, m.url)
                for m in self.plan.members
                if m.engine_id in self.plan.joiners and m.engine_id not in known
            ]
        return handles

    def _handle(self, engine_id: str, url: str) -> EngineHandle:
        """With its pid where its agent told it: a launcher on its host can stop an engine another
        coordinator launched."""
        info = self.infos.get(engine_id)
        return EngineHandle(engine_id=engine_id, url=url, pid=info.pid if info is not None else None)

    def leaver_handles(self) -> list[EngineHandle]:
        if self.plan is None:
            return []
        return [
            self._handle(m.engine_id, m.url)
            for m in self.plan.old_members
            if m.engine_id in self.plan.leavers
        ]

    def downtime(self, *, now: float | None = None) -> Downtime:
        """The union of the pauses of the engines that were serving (the old generation's members):
        a joiner was not serving before, so its wait stops no one; its own interval is still listed."""
        pauses = {eid: s.pause for eid, s in self.statuses.items() if s.job_id == self.job_id}
        plan = self.plan
        old = {m.engine_id for m in plan.old_members} if plan and plan.old_members else None
        return job_downtime(pauses, now=now, serving=old)

    def downtime_record(self, *, now: float | None = None) -> dict[str, Any]:
        """`downtime_ms` and `downtime` as the job records them, with the coordinator's commit timing."""
        downtime = self.downtime(now=now)
        return {
            "downtime_ms": downtime.downtime_ms,
            "downtime": {**downtime.as_dict(), "coordinator": self.commit_timing_ms()},
        }

    def engine_results(self, *, ended_on: EndedOn | None = None) -> list[dict[str, Any]]:
        """Per-engine results: role, ranks, the agent's phase, the generation each engine served
        before the job and serves after it, pause and transfer. `ended_on`: the generation the job
        ended on (`new`: the members switched, leavers left; `old`: the old members serve the old
        one, joiners were released); None while it runs (after: not known yet)."""
        plan = self.plan
        if plan is None:
            return []
        old_rank = {m.engine_id: i for i, m in enumerate(plan.old_members)}
        new_rank = {m.engine_id: i for i, m in enumerate(plan.members)}
        results = []
        for member in plan.participants:
            status = self.statuses.get(member.engine_id)
            info = self.infos.get(member.engine_id)
            before = plan.old_generation if member.engine_id in old_rank else None
            after = before if ended_on == "old" else None
            if ended_on == "new" and member.engine_id in new_rank:
                after = plan.generation
            results.append(
                {
                    "engine_id": member.engine_id,
                    "url": member.url,
                    "role": plan.role(member.engine_id).value,
                    "old_rank": old_rank.get(member.engine_id),
                    "new_rank": new_rank.get(member.engine_id),
                    "generation_before": before,
                    "generation_after": after,
                    "platform": info.platform.value if info else None,
                    "phase": status.phase.value if status else None,
                    "generation": status.generation if status else None,  # the job's (its target)
                    "step": status.step if status else None,
                    "bytes_moved": status.bytes_moved if status else 0,
                    # by source: a covered self-heal loads and receives nothing (`resident`)
                    "bytes_loaded": status.bytes_loaded if status else 0,
                    "bytes_received": status.bytes_received if status else 0,
                    "bytes_resident": status.bytes_resident if status else 0,
                    "transfer_backend": status.transfer_backend.value
                    if status and status.transfer_backend
                    else None,
                    "synced_value": status.synced_value if status else None,
                    "graphs": status.graphs.model_dump(mode="json") if status and status.graphs else None,
                    "pause": status.pause.model_dump(mode="json") if status and status.pause else None,
                    "error": status.error.model_dump(mode="json") if status and status.error else None,
                }
            )
        return results


def progress_fraction(statuses: Iterable[ReconfigStatus]) -> float:
    done = total = 0
    for status in statuses:
        done += status.steps_done
        total += status.steps_total
    return done / total if total else 0.0


def progress_percent(step: str, fraction: float) -> float:
    start, end = PROGRESS_BANDS.get(step.split(":")[0], (0.0, 100.0))
    return round(start + (end - start) * max(0.0, min(fraction, 1.0)), 1)
