"""Launchers: where the engines of a deployment come from, and where they go after a scale-down.

The runner only knows this interface. `local` starts agent processes on this machine; `static` uses
agents that registered themselves. A cluster launcher (Ray, Kubernetes) implements the same three
methods: make engines available, release engines, shut down, and nothing in the runner changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core.faults import EngineFault
from app.launchers.readiness import LaunchBudget, LaunchHistory
from engine_agent.protocol import EngineConfig


class LaunchError(EngineFault):
    """Engines could not be made available; `engine_id` names the one that failed, when known."""

    type = "launch-failed"


@dataclass(frozen=True)
class LaunchSpec:
    """What a launcher needs to know about the deployment it starts engines for."""

    deployment: str
    engine: EngineConfig
    # Agents announce themselves here: one URL, or several comma-separated (every live coordinator
    # sharing the database, the launching one first) that they fail over between.
    coordinator_url: str | None = None
    token: str | None = None  # the bearer token agents register with
    extra_args: tuple[str, ...] = ()
    # The deployment's agent key (and the previous one during a rotation's overlap, with the instant
    # that overlap ends, wall-clock epoch seconds): agents get them through their environment
    # (EPCTL_AGENT_KEY, EPCTL_AGENT_KEY_PREVIOUS, EPCTL_AGENT_KEY_PREVIOUS_UNTIL), never a command line.
    agent_key: str | None = field(default=None, repr=False)
    agent_key_previous: str | None = field(default=None, repr=False)
    agent_key_previous_until: float | None = None
    # The deployment's launch readiness timeout (`launch_timeout_s`); None: adaptive
    # (`app.launchers.readiness.launch_budget`).
    launch_timeout_s: float | None = None

    def agent_key_environment(self) -> dict[str, str | None]:
        """The agent's keys as its environment gives them (a previous key only with its end)."""
        with_end = self.agent_key_previous is not None and self.agent_key_previous_until is not None
        return {
            "EPCTL_AGENT_KEY": self.agent_key,
            "EPCTL_AGENT_KEY_PREVIOUS": self.agent_key_previous if with_end else None,
            "EPCTL_AGENT_KEY_PREVIOUS_UNTIL": f"{self.agent_key_previous_until:.3f}" if with_end else None,
        }


@dataclass(frozen=True)
class EngineHandle:
    """An engine a launcher made available: enough to call its agent."""

    engine_id: str
    url: str
    pid: int | None = None


@dataclass(frozen=True)
class DeletedDeployment:
    """A deployment just deleted, with the engines it still had (what its launcher should stop)."""

    name: str
    backend: str
    launcher: str
    engine: EngineConfig
    engines: tuple[EngineHandle, ...]


@dataclass(frozen=True)
class EnginesToRestart:
    """Engines of one deployment and launcher that refuse the coordinator's agent key: their launcher
    stops them, and self-healing replaces them with engines launched with the current key."""

    deployment: str
    backend: str
    engine: EngineConfig
    launcher: str
    engines: tuple[EngineHandle, ...]


class Launcher(ABC):
    name: str

    @property
    def launch_history(self) -> LaunchHistory:
        """The start-to-ready times of the launches this launcher saw become ready (in memory)."""
        history = self.__dict__.get("_launch_history")
        if history is None:
            history = self.__dict__["_launch_history"] = LaunchHistory()
        return history

    def launch_budget(self, spec: LaunchSpec, default_s: float) -> LaunchBudget:
        """The deadline a launch for `spec` gets (the deployment's, else adaptive from `default_s`, the
        coordinator's launch deadline, and this launcher's history): callers pass its `deadline_s`."""
        return self.launch_history.budget(spec.deployment, spec.launch_timeout_s, default_s)

    def still_starting(self, deployment: str) -> dict[str, str]:
        """The launches of `deployment` in progress past their deadline, waited for all the same: what
        each is doing, by engine id (the job's log shows it); {} when none is, or the launcher cannot tell."""
        return {}

    @abstractmethod
    async def ensure_engines(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> list[EngineHandle]:
        """Return exactly `count` engines, idle and ready to join `spec.deployment`.

        `idle` are the engines the coordinator already knows to be idle for this deployment; a launcher
        uses them first and starts only what is missing. Raises `LaunchError` if it cannot, after
        stopping anything it started for this call.
        """

    async def ensure_some(
        self, spec: LaunchSpec, count: int, idle: Sequence[EngineHandle], *, deadline_s: float
    ) -> tuple[list[EngineHandle], LaunchError | None]:
        """Up to `count` engines: as many as it can make available (a partial grow, issue 38), the
        `idle` ones first, with what kept it from the rest (None: nothing); never raises for a
        shortfall. Default: all of them, else the idle ones alone (a launcher that can start some of
        what it lacks overrides this)."""
        try:
            return await self.ensure_engines(spec, count, idle, deadline_s=deadline_s), None
        except LaunchError as exc:
            return list(idle[:count]), exc

    @abstractmethod
    async def release(self, spec: LaunchSpec, engines: Sequence[EngineHandle]) -> list[str]:
        """Give back engines the deployment no longer uses (leavers after a scale-down, joiners of a
        rolled-back job). Returns the ids of the engines that no longer exist (the coordinator forgets
        them); engines kept alive (a static pool) are not listed."""

    async def explain(self, spec: LaunchSpec, engine_ids: Sequence[str]) -> dict[str, str]:
        """Why engines stopped answering, in the launcher's own terms (a cluster launcher asks its
        cluster: "actor killed", "node lost"), by engine id; {} when it cannot tell. For the job's error
        when an engine it started is lost after its launch."""
        return {}

    async def release_lost(self, engines: Sequence[EngineHandle]) -> None:  # noqa: B027 - optional hook
        """Stop engines the coordinator wrote off (lost: silent past the heartbeat timeout), wherever
        they still run, so a frozen one cannot come back into a group. Default: nothing to stop."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Stop everything this launcher started (coordinator shutdown)."""
