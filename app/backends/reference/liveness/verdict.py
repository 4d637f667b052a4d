"""What the judge decides for one deployment in one pass (plain values; `act` writes them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class Fate(StrEnum):
    """What became of one engine in this pass (the last rule that decided it)."""

    lost = "lost"  # unreachable: silent past the heartbeat timeout, or its process is gone
    link_lost = "link-lost"  # not heard, but its group steps (or the coordinator hears nobody)
    stalled = "stalled"  # fenced: every other member named it when the group broke
    frozen = "frozen"  # fenced: every other member waits on it in a collective, and nobody gets an answer
    cut_off = "cut-off"  # fenced: its data network does not reach the others
    silent_at_start = "silent-at-start"  # fenced: it did not answer a starting coordinator
    written_off = "written-off"  # left for good, stopped by its launcher
    answered = "answered"  # its record takes what it answered a starting coordinator


@dataclass(frozen=True)
class EngineVerdict:
    """One engine's fate and the row as it leaves the pass."""

    engine_id: str
    fate: Fate
    why: str
    state: str
    dp_rank: int | None
    generation: int
    world_size: int
    link_lost_at: datetime | None
    heard_at: datetime | None  # a starting coordinator's answer counts as a heartbeat
    announce_unreachable: bool = False  # `engine.unreachable` (it was marked so in this pass)
    member: bool = False  # it was a member of the deployment's generation when lost
    release: bool = False  # stop it through the launcher that started it


@dataclass(frozen=True)
class StatusVerdict:
    """The deployment's status as the pass leaves it (written through `set_status`)."""

    status: str  # ready | degraded
    reason: str | None = None
    message: str = ""
    hint: str | None = None
    serving: int = 0
    announce_again: bool = False  # a new reason the operator must act on is announced again
    hit_job_id: str | None = None  # a new incident is linked to the job that just made the generation
    # When the newest job self-healing did not start was created: an operator's job since an incident
    # resolved makes a relapse a new loss (`app.deployments.incidents.service.reopen_if_same_loss`).
    operator_job_at: datetime | None = None


@dataclass(frozen=True)
class HealJob:
    """The one action: a self-heal job to `target`."""

    target: int
    reason: str
    loss_at: datetime | None
    detected: bool = True  # the first job after the loss records the time to detect it


@dataclass(frozen=True)
class NoJob:
    """No job this pass, and why (for the log and the table test)."""

    why: str


Action = HealJob | NoJob

# Why no job: the common answers.
WHOLE = "whole"
JOB_OWNS_IT = "a job owns it"
POLICY_NONE = "on_engine_loss none: the operator acts"
WAITING = "waiting for the survivors to leave the broken generation"
RETRY_PAUSE = "the last self-heal attempt just failed: waiting before the next"
HEAL_STOPPED = "too many self-heal attempts failed in a row"
NO_SURVIVORS = "no survivor and no launcher to start engines"
FENCED_MAY_RETURN = "a fenced engine may come back within the grace"
NOTHING = "nothing to heal"
EMPTY = "no engines to judge (size 0)"


@dataclass(frozen=True)
class HealMemory:
    lost: str | None
    loss_at: datetime | None
    target: int | None


@dataclass(frozen=True)
class Leave:
    """Tell these members to give up `generation`'s group now (`POST /v1/generation/broken`): the member
    they wait on was fenced (issue 39), so they stop waiting before the serving deadline."""

    generation: int
    engines: tuple[tuple[str, str], ...]  # (engine id, url)
    reason: str


@dataclass(frozen=True)
class Verdict:
    deployment: str
    engines: tuple[EngineVerdict, ...] = ()
    status: StatusVerdict | None = None  # None: unchanged
    memory: HealMemory | None = None  # None: unchanged
    action: Action = field(default_factory=lambda: NoJob(NOTHING))
    # Engines named on the open incident, with the loss time they go back to.
    lost_to_incident: tuple[tuple[tuple[str, ...], datetime], ...] = ()
    broken_since: datetime | None = None  # the controller's memory for the next pass
    deaf: bool = False  # the coordinator hears no engine at all
    leave: Leave | None = None  # the survivors of a frozen member to tell, once the verdict is written
    notes: tuple[str, ...] = ()  # what the pass decided, in words (logged)

    @property
    def writes_nothing(self) -> bool:
        """Nothing to write, log or ask for (a steady deployment's verdict: most of them, every pass)."""
        return (
            not self.engines
            and self.status is None
            and self.memory is None
            and not self.lost_to_incident
            and self.job is None
            and self.leave is None
            and not self.notes
        )

    def fate(self, engine_id: str) -> Fate | None:
        return next((e.fate for e in self.engines if e.engine_id == engine_id), None)

    @property
    def job(self) -> HealJob | None:
        return self.action if isinstance(self.action, HealJob) else None
