"""The agent's side of fenced generations: a switch that comes after the pause lease ran out (the engine
was frozen, the coordinator gave up on the commit) is refused, and the engine serves its old generation.
Real agent processes, one of them frozen with SIGSTOP."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from collections.abc import Callable

import pytest

from engine_agent.protocol import AgentState, ReconfigPhase
from tests.agent.driver import AgentProcess, Driver, assert_serves_reference
from tests.agent.test_agent_failures import start_job

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]
LEASE_S = 1.0


def test_an_agent_thawed_after_its_pause_lease_never_completes_the_queued_switch(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents[:1])
    job_id, everyone = start_job(driver, agents)
    driver.wait_phase(everyone, ReconfigPhase.prepared)
    driver.post_all(everyone, "/v1/reconfig/sync", {"job_id": job_id})
    driver.wait_phase(everyone, ReconfigPhase.synced)
    driver.post_all(everyone, "/v1/reconfig/pause", {"job_id": job_id, "lease_s": LEASE_S})
    driver.wait_phase(everyone, ReconfigPhase.paused)
    frozen = agents[0]
    os.kill(frozen.process.pid, signal.SIGSTOP)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # The switch reaches the frozen engine's socket and waits there, as in a real freeze.
            queued = pool.submit(
                frozen.client.post, "/v1/reconfig/switch", json={"job_id": job_id}, timeout=30
            )
            time.sleep(LEASE_S * 2)  # frozen past its lease (the fault, not an assertion)
            os.kill(frozen.process.pid, signal.SIGCONT)
            answer = queued.result(timeout=30)
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    # Refused at once (409: the lease timer won), or accepted (202, the agent's answer to every action) and
    # then fenced in the window: never switched.
    assert answer.status_code in (202, 409), answer.text
    status = driver.wait_phase([frozen], ReconfigPhase.failed, timeout_s=20)[frozen.engine_id]
    assert status.error is not None and status.error.type == "pause-lease-expired"
    info = frozen.info()
    assert (info.state, info.generation) == (AgentState.serving, 1)
    driver.abort([agents[1]], job_id)
    assert_serves_reference(agents[:1])
