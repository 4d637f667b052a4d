"""The runner's knobs (`EPCTL_RUNNER_*`), and the test hook that stops a job at a named point.

Three knobs come from the coordinator's own settings instead: the lease length (`EPCTL_JOB_LEASE_S`),
one agent call's deadline (`EPCTL_AGENT_TIMEOUT_S`) and how long an engine may stay silent
(`EPCTL_HEARTBEAT_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.config import ConfigError
from engine_agent.protocol import (
    MAX_JOB_TIMEOUT_S,
    MAX_PAUSE_LEASE_S,
    MAX_SERVING_COLLECTIVE_S,
    TransferBackend,
)

log = logging.getLogger(__name__)

# Where a test may stop a job (EPCTL_RUNNER_TEST_HANG_AT), in the order a job passes them.
HANG_POINTS = ("prepared", "synced", "paused", "arming", "armed", "switched", "cleaning_up")


class RunnerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPCTL_RUNNER_", extra="ignore", env_ignore_empty=True)

    enabled: bool = True
    coordinator_id: str = Field("", description="lease owner name; default host:pid")
    poll_interval_s: float = Field(0.25, gt=0, description="how often to look for jobs to claim")
    agent_poll_interval_s: float = Field(
        0.05,
        gt=0,
        description="between two status reads of an agent that did not hold its answer (prepare, sync, "
        "waiting for aborts)",
    )
    commit_poll_interval_s: float = Field(
        0.003, gt=0, description="the same inside the pause, where every millisecond is downtime"
    )
    progress_long_poll_s: float = Field(
        1.0, gt=0, description="longest hold of one agent long-poll in prepare/sync (progress granularity)"
    )
    launch_deadline_s: float = Field(60.0, gt=0)
    prepare_deadline_s: float = Field(120.0, gt=0)
    sync_deadline_s: float = Field(30.0, gt=0)
    pause_deadline_s: float = Field(10.0, gt=0, description="every engine confirms its pause within this")
    switch_deadline_s: float = Field(15.0, gt=0)
    arm_deadline_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="engine-agreed commit: every engine of the old generation arms within this, or each "
        "withdraws its arm, nothing pauses and the job rolls back",
    )
    abort_deadline_s: float = Field(10.0, gt=0)
    # Within the agents' own bounds (engine_agent/protocol.py): an agent refuses more (422).
    pause_lease_s: float = Field(
        10.0, gt=0, le=MAX_PAUSE_LEASE_S, description="a paused agent resumes by itself after this"
    )
    rendezvous_s: float = Field(30.0, gt=0, le=MAX_JOB_TIMEOUT_S)
    collective_s: float = Field(30.0, gt=0, le=MAX_JOB_TIMEOUT_S)
    serving_collective_s: float = Field(
        5.0,
        gt=0,
        le=MAX_SERVING_COLLECTIVE_S,
        description="deadline of one serving collective once every member of a generation stepped on it "
        "(a peer that stalls longer breaks the generation and the others leave it). Far above a step "
        "(milliseconds) and a busy host's stall (a few hundred ms), so a slow step is never taken for a "
        "lost peer; below the heartbeat timeout, so the survivors of a frozen engine have left its group "
        "by the time it is written off. A peer that died is left at once (its peers' notice), not at this",
    )
    transfer_s: float = Field(120.0, gt=0, le=MAX_JOB_TIMEOUT_S)
    cleanup_poll_interval_s: float = Field(0.5, gt=0)
    heartbeat_check_interval_s: float = Field(
        1.0, gt=0, description="how often to look for engines whose heartbeats stopped"
    )
    health_confirm_s: float = Field(
        3.5,
        ge=0,
        description="a deployment whose engines stopped serving its generation (though heartbeating) is "
        "degraded once this stays so for this long (one agent heartbeat interval, plus margin)",
    )
    desired_size_interval_s: float = Field(
        1.0, gt=0, description="how often to act on deployments' standing autoscaler intents"
    )
    standing_target_retry_s: float = Field(
        30.0,
        gt=0,
        description="a partial grow's standing target: how long after the last attempt ended the next "
        "one starts (a static pool's idle engine starts it at once)",
    )
    intent_ttl_s: float = Field(
        86400.0,
        gt=0,
        description="a standing autoscaler intent nobody repeated for this long expires (an Alertmanager "
        "repeats a firing group every repeat_interval: keep this above it)",
    )
    public_url: str | None = Field(None, description="the coordinator URL local agents register with")
    agent_token: str | None = Field(None, description="the token local agents register with")
    state_dir: Path | None = Field(None, description="local launcher state; default <data_dir>")
    local_agent_args: str = Field("", description="extra arguments for locally launched agents")
    local_agent_host: str = Field(
        "127.0.0.1", description="local agents' control address (their HTTP API: what the coordinator calls)"
    )
    local_agent_data_host: str | None = Field(
        None,
        description="local agents' data address (store, collectives, weights); default their control one",
    )
    local_agent_command: str = Field("", description="the agent command for the local launcher (epctl-agent)")
    local_agent_zygote: str = Field(
        "",
        description="the socket of an agent zygote (`python -m engine_agent.zygote SOCKET`): local agents "
        "are forked from it instead of importing torch each; none answering, a fresh interpreter starts. "
        "A forked agent holds the zygote's environment: start the zygote with no secrets in it",
    )
    local_agent_orphan_grace_s: float | None = Field(
        None,
        gt=0,
        description="off by default: local agents never exit because no coordinator answers (a later "
        "`epctl up` adopts them, `epctl down` stops them). A number opts in to an orphan exit, for "
        "throwaway machines only: agents exit this long after their coordinator died, unless adopted",
    )
    transfer_backend: TransferBackend | None = Field(
        None, description="force the weight-transfer backend (default: NIXL when every engine has it)"
    )
    # Tests only: stop driving jobs at a named point (one of HANG_POINTS) and write a marker file, so a
    # test can SIGKILL the coordinator there.
    test_hang_at: str | None = None
    test_marker_file: Path | None = None

    @model_validator(mode="after")
    def _warn_unfenced(self) -> RunnerSettings:
        if self.switch_deadline_s <= self.pause_lease_s:
            # The fence (app/backends/reference/fencing.py) needs the coordinator to give up on a commit
            # only after every pause lease ran out; otherwise a late agent could still complete an
            # abandoned switch.
            log.warning(
                "EPCTL_RUNNER_SWITCH_DEADLINE_S (%s) <= EPCTL_RUNNER_PAUSE_LEASE_S (%s): a late agent may "
                "complete a switch the coordinator abandoned",
                self.switch_deadline_s,
                self.pause_lease_s,
            )
        return self

    def longest_agent_step_s(self) -> float:
        """The longest one step of an agent may take by its own deadlines (an abort waits for it)."""
        return max(self.rendezvous_s, self.collective_s, self.transfer_s) + 2.0


def load_runner_settings() -> RunnerSettings:
    """The runner's settings, or `ConfigError` naming every bad `EPCTL_RUNNER_*` value."""
    try:
        return RunnerSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"EPCTL_RUNNER_{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None


async def hang_for_test(settings: RunnerSettings, point: str) -> None:
    """Tests only: at `point`, when asked to, stop here (forever) so the coordinator can be killed."""
    if settings.test_hang_at != point:
        return
    log.warning("test hook: hanging at %s", point)
    if settings.test_marker_file is not None:
        settings.test_marker_file.write_text(point)
    while True:
        await asyncio.sleep(3600)
