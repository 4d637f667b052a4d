"""The judge's working copy of one view: the rules read and change it in turn, and the verdict is what
it holds at the end (pure; see `judge`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from app.backends.reference.liveness.health import HEALTH_HINT, Health, assess, serves
from app.backends.reference.liveness.verdict import (
    Action,
    EngineVerdict,
    Fate,
    HealMemory,
    Leave,
    NoJob,
    StatusVerdict,
    Verdict,
)
from app.backends.reference.liveness.view import DeploymentView, EngineSeen, Rules
from app.deployments.engines.models import SERVING_STATES, EngineState
from app.deployments.incidents import outage
from app.deployments.models import OnEngineLoss
from app.jobs.models import RequestSource
from app.jobs.states import TERMINAL_STATES, JobState

TERMINAL_JOB_STATES = frozenset(state.value for state in TERMINAL_STATES)
SERVING = EngineState.serving.value


@dataclass
class Board:
    view: DeploymentView
    now: datetime
    rules: Rules
    engines: dict[str, EngineSeen] = field(default_factory=dict)  # as the pass leaves them
    fates: dict[str, tuple[Fate, str]] = field(default_factory=dict)
    announced: set[str] = field(default_factory=set)
    members_lost: set[str] = field(default_factory=set)
    released: set[str] = field(default_factory=set)
    heard: dict[str, datetime] = field(default_factory=dict)
    status: str = ""
    detail: dict[str, object] | None = None
    status_written: StatusVerdict | None = None
    heal_lost: str | None = None
    heal_loss_at: datetime | None = None
    heal_target: int | None = None
    memory_changed: bool = False
    lost_to_incident: list[tuple[tuple[str, ...], datetime]] = field(default_factory=list)
    action: Action | None = None
    broken_since: datetime | None = None
    deaf: bool = False
    leave: Leave | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, view: DeploymentView, now: datetime, rules: Rules) -> Board:
        return cls(
            view=view,
            now=now,
            rules=rules,
            engines={e.id: e for e in view.engines},
            status=view.status,
            detail=dict(view.status_detail) if view.status_detail else None,
            heal_lost=view.heal_lost,
            heal_loss_at=view.heal_loss_at,
            heal_target=view.heal_target_dp_size,
            broken_since=view.broken_since,
        )

    # --- reading -------------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.view.current_dp_size

    @property
    def generation(self) -> int:
        return self.view.generation

    @property
    def reason(self) -> str | None:
        return None if self.detail is None else str(self.detail.get("reason"))

    def live(self) -> list[EngineSeen]:
        """The engines not written off in this pass, in the view's order."""
        return [e for e in self.engines.values() if e.state != EngineState.left.value]

    def health(self) -> Health:
        return assess(self.size, self.generation, self.live())

    def on_generation(self) -> list[EngineSeen]:
        return [e for e in self.live() if serves(e, self.generation)]

    def member(self, engine: EngineSeen) -> bool:
        return engine.dp_rank is not None and engine.generation == self.generation

    def ready_and_clear(self) -> bool:
        return self.status == "ready" and self.detail is None

    # --- changing ------------------------------------------------------------------------------------

    def set(self, engine: EngineSeen, fate: Fate, why: str, **changes: object) -> EngineSeen:
        if changes.get("state", SERVING) not in SERVING_STATES:
            # Out of its group (lost, fenced, written off): no longer a lost link of a group that steps.
            # Kept, it refused every job on the deployment, the self-heal's too (issue 34: a frozen
            # member vouched for in a job, then lost, left the survivors idle with no heal).
            changes.setdefault("link_lost_at", None)
        changed = replace(engine, **changes)  # type: ignore[arg-type]
        self.engines[engine.id] = changed
        self.fates[engine.id] = (fate, why)
        return changed

    def write_status(
        self,
        status: str,
        reason: str | None = None,
        message: str = "",
        *,
        hint: str | None = None,
        serving: int = 0,
        announce_again: bool = False,
    ) -> None:
        detail: dict[str, object] | None = (
            None if reason is None else {"reason": reason, "message": message, "hint": hint}
        )
        self.status, self.detail = status, detail
        self.status_written = StatusVerdict(
            status,
            reason,
            message,
            hint,
            serving,
            announce_again or bool(self.status_written and self.status_written.announce_again),
        )

    def degrade_for_health(self, health: Health) -> None:
        assert health.reason is not None
        self.write_status("degraded", health.reason, health.message, hint=HEALTH_HINT, serving=health.serving)

    def take_out(self, engines: list[EngineSeen], state: EngineState, fate: Fate, why: str | None) -> None:
        """Off the deployment's generation, the loss recorded for the self-heal jobs (its memory)."""
        named = []
        for engine in engines:
            silent = (
                f"{engine.id} (silent {(self.now - engine.last_heartbeat_at).total_seconds():.1f} s)"
                if engine.last_heartbeat_at
                else engine.id
            )
            named.append(f"{engine.id} ({why})" if why else silent)
            self.set(
                engine, fate, why or "silent past the heartbeat timeout", state=state.value, dp_rank=None
            )
            if state is EngineState.left:
                self.released.add(engine.id)
        newest = self.view.newest_jobs[0] if self.view.newest_jobs else None
        if newest is not None and newest.requested_by != RequestSource.self_heal.value:
            # An operator's job came after the last loss: its size is the one to return to, and what an
            # earlier heal left (its target, its loss) is over (a stale target larger than the idle
            # engines can fill would block the grow-back for good).
            self.heal_lost, self.heal_loss_at, self.heal_target = None, None, None
        self.heal_lost = ", ".join(filter(None, [self.heal_lost, *named]))[:1000]
        # The loss happened after the last heartbeat heard from it: the earliest such, over the losses.
        heard = [e.last_heartbeat_at for e in engines if e.last_heartbeat_at is not None]
        self.heal_loss_at = min([*heard, *filter(None, [self.heal_loss_at])], default=self.now)
        self.lost_to_incident.append((tuple(e.id for e in engines), self.heal_loss_at))
        if self.view.policy is OnEngineLoss.replace:
            self.heal_target = max(self.heal_target or 0, self.size)
        self.memory_changed = True
        verb = "fenced" if state is EngineState.fenced else "wrote off"
        self.notes.append(f"{verb} {', '.join(named)}")

    def forget_loss(self, *, lost: bool = True, target: bool = False) -> None:
        if lost:
            self.heal_lost = None
        if target:
            self.heal_target, self.heal_loss_at = None, None
        self.memory_changed = True

    def hit_job(self) -> str | None:
        """The job an incident opened now hit: the job that runs, or (`outage.hits`) the newest, when it
        ended within the hit window and either made the deployment's generation (clients' outage right
        after a job belongs on that job's record too) or ended while its clients had no answer (they
        share the figure)."""
        if self.view.active_job is not None:
            # Opened while a job runs (`serving_in_a_job`): its probe saw what clients saw from the loss.
            return self.view.active_job.id
        newest = self.view.newest_jobs[0] if self.view.newest_jobs else None
        if newest is None or newest.state not in TERMINAL_JOB_STATES:
            return None
        hit = outage.hits(
            ended_s_ago=(self.now - newest.updated_at).total_seconds(),
            succeeded=newest.state == JobState.succeeded.value,
            made_this_generation=newest.to_generation == self.generation,
            clients_out_at_end=newest.clients_out_at_end,
            window_s=self.rules.hit_window_s,
        )
        return newest.id if hit else None

    def operator_job_at(self) -> datetime | None:
        """When the newest job self-healing did not start was created (None: none among the newest)."""
        heal = RequestSource.self_heal.value
        return next((j.created_at for j in self.view.newest_jobs if j.requested_by != heal), None)

    # --- the verdict ---------------------------------------------------------------------------------

    def verdict(self) -> Verdict:
        engines = []
        for engine_id, (fate, why) in self.fates.items():
            after, before = self.engines[engine_id], self.view.engine(engine_id)
            engines.append(
                EngineVerdict(
                    engine_id=engine_id,
                    fate=fate,
                    why=why,
                    state=after.state,
                    dp_rank=after.dp_rank,
                    generation=after.generation,
                    world_size=after.world_size,
                    link_lost_at=after.link_lost_at,
                    heard_at=after.last_heartbeat_at
                    if after.last_heartbeat_at != before.last_heartbeat_at
                    else None,
                    announce_unreachable=engine_id in self.announced,
                    member=engine_id in self.members_lost,
                    release=engine_id in self.released,
                )
            )
        memory = (
            HealMemory(self.heal_lost, self.heal_loss_at, self.heal_target)
            if self.memory_changed
            and (self.heal_lost, self.heal_loss_at, self.heal_target)
            != (self.view.heal_lost, self.view.heal_loss_at, self.view.heal_target_dp_size)
            else None
        )
        status = self.status_written
        if status is not None and status.status == "degraded":
            status = replace(status, hit_job_id=self.hit_job(), operator_job_at=self.operator_job_at())
        return Verdict(
            deployment=self.view.name,
            engines=tuple(engines),
            status=status,
            memory=memory,
            action=self.action or NoJob("nothing to heal"),
            lost_to_incident=tuple(self.lost_to_incident),
            broken_since=self.broken_since,
            deaf=self.deaf,
            leave=self.leave,
            notes=tuple(self.notes),
        )
