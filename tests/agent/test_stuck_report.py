"""Issue 39, the agent's side: how long a serving collective has waited (`CommGroup.stuck_s`, read by the
heartbeat) and the heartbeat as sent (`agent.heartbeat_body`: the `stuck_*` fields only while stuck, so
an older coordinator that refuses unknown fields still takes every other heartbeat). The real-process
proof is tests/e2e/test_engines_outlive_the_coordinator.py."""

from __future__ import annotations

import torch

from engine_agent.agent import STUCK_FIELDS, heartbeat_body
from engine_agent.groups import CommGroup
from engine_agent.protocol import AgentHeartbeat, AgentState


def group() -> CommGroup:
    return CommGroup("ep", 3, None, 0, 2, torch.device("cpu"), 10.0, slow_after_s=0.5)


def test_a_wait_counts_as_stuck_only_past_the_slow_mark() -> None:
    waiting = group()
    assert waiting.stuck_s(now=100.0) is None  # not waiting on a collective
    waiting.waiting_since = 99.8
    assert waiting.stuck_s(now=100.0) is None  # a step's wait, not a stall
    waiting.waiting_since = 99.0
    assert waiting.stuck_s(now=100.0) == 1.0


def test_the_stuck_fields_are_sent_only_while_stuck() -> None:
    plain = AgentHeartbeat(state=AgentState.serving, generation=3, rank=0, world_size=2)
    assert STUCK_FIELDS.isdisjoint(heartbeat_body(plain))
    stuck = plain.model_copy(update={"stuck_generation": 3, "stuck_ms": 812.5, "stuck_unanswered": ["e1"]})
    sent = heartbeat_body(stuck)
    assert (sent["stuck_generation"], sent["stuck_ms"], sent["stuck_unanswered"]) == (3, 812.5, ["e1"])
