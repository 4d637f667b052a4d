"""A leaving engine keeps serving until the switch actually happens: it stops admitting only at its
pause (draining what it holds at the step boundary), not from the start of prepare. Real agents."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine_agent.protocol import AgentState, ReconfigPhase
from tests.agent.driver import SMALL, AgentProcess, Driver, assert_serves_reference, random_tokens

pytestmark = pytest.mark.processes

Spawn = Callable[..., list[AgentProcess]]


def test_a_leaver_serves_through_prepare_and_goes_idle_only_at_the_switch(spawn_agents: Spawn) -> None:
    agents = spawn_agents(2)
    driver = Driver()
    driver.reconfigure(agents)
    staying, leaver = agents
    staying.faults(hang_prepare_at_step="transfer")

    def while_prepare_is_held() -> None:
        driver.wait_step(staying, "transfer")
        assert leaver.status().phase != ReconfigPhase.paused
        assert_serves_reference([staying, leaver])  # the leaver answers too, correctly
        staying.faults(release_hang=True)

    outcome = driver.reconfigure([staying], during_prepare=while_prepare_is_held)
    assert outcome.statuses[leaver.engine_id].role == "leaving"
    assert leaver.info().state == AgentState.idle
    assert leaver.infer(random_tokens(SMALL, 1)).status_code == 503
    assert_serves_reference([staying])
