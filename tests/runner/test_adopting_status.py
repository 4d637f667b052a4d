"""A restarted coordinator's deployments read `adopting`, not `ready`, until its adoption decides (issue 34
item 3: past the start's bound, agent call deadline + 2 s, it answered `ready` from the record while a
member was frozen). The rule (`app.deployments.status`: which statuses adoption asks about, the moves)
as tables; the adoption itself against fake agents whose answer the test holds back."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.agents.errors import AgentSilent
from app.deployments.incidents.models import Incident
from app.deployments.models import DeploymentStatus
from app.deployments.status import MOVES, adopting_from
from app.webhooks.models import EventType, OutboxEvent
from engine_agent.protocol import AgentInfo
from tests.runner.fakes import FakeAgent
from tests.runner.scenario import Scenario, make_scenario

S = DeploymentStatus


@pytest.mark.parametrize(
    ("status", "asked"),
    [
        (S.ready, True),  # says it serves: unknown until every member answered
        (S.adopting, True),  # left so by a coordinator that stopped mid-adoption: asked again
        (S.degraded, False),  # already says what is known
        (S.stopped, False),
    ],
)
def test_adoption_asks_about_the_deployments_that_say_they_serve(status: S, asked: bool) -> None:
    assert adopting_from(status) is asked


@pytest.mark.parametrize(
    ("before", "after", "event"),
    [
        (S.ready, S.adopting, None),  # nothing lost yet: no event, no incident
        (S.adopting, S.adopting, None),
        (S.adopting, S.ready, None),  # every member answered: as it was
        (S.adopting, S.degraded, EventType.deployment_degraded),  # one did not: announced
        (S.adopting, S.stopped, None),
    ],
)
def test_the_moves_in_and_out_of_adopting(before: S, after: S, event: EventType | None) -> None:
    assert MOVES[(before, after)] == event


@pytest.mark.parametrize(("before", "after"), [(S.degraded, S.adopting), (S.stopped, S.adopting)])
def test_only_a_deployment_that_says_it_serves_moves_to_adopting(before: S, after: S) -> None:
    assert (before, after) not in MOVES


def _held_back(agent: FakeAgent, asked: asyncio.Event, answer: asyncio.Event, *, silent: bool) -> None:
    """`agent`'s `/v1/info` waits for `answer` (a member frozen: the call runs to its deadline)."""
    answers = agent.info

    async def info(*, timeout_s: float | None = None) -> AgentInfo:
        asked.set()
        await answer.wait()
        if silent:
            raise AgentSilent(agent.engine_id, "info: no answer within the deadline")
        return await answers(timeout_s=timeout_s)

    agent.info = info  # type: ignore[method-assign]


def _adopt_with_one_member_held_back(stage: Scenario, *, silent: bool) -> tuple[str, str, str]:
    """The status before the member answers, after a periodic pass meanwhile, and after the verdict."""
    asked, answer = asyncio.Event(), asyncio.Event()
    _held_back(stage.serving[-1], asked, answer, silent=silent)

    async def go() -> tuple[str, str, str]:
        stage.liveness.start_adoption(stage.fleet)
        await asyncio.wait_for(asked.wait(), 10)
        undecided = stage.deployment().status
        await stage.liveness.tick()  # the heartbeats say whole: the pass must not say `ready` for it
        after_a_pass = stage.deployment().status
        answer.set()
        await stage.liveness.adoption()
        return undecided, after_a_pass, stage.deployment().status

    return asyncio.run(go())


def test_a_deployment_reads_adopting_until_a_frozen_member_is_judged(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, serving=3, idle=0)
    frozen = stage.serving[-1]
    for survivor in stage.serving[:-1]:  # their group broke on it while no coordinator ran
        survivor.rank, survivor.generation = None, 0
    assert _adopt_with_one_member_held_back(stage, silent=True) == ("adopting", "adopting", "degraded")
    assert stage.engine_rows()[frozen.engine_id].state == "fenced"


def test_a_whole_deployment_reads_ready_again_once_every_member_answered(db_engine: DbEngine) -> None:
    stage = make_scenario(db_engine, serving=3, idle=0)
    assert _adopt_with_one_member_held_back(stage, silent=False) == ("adopting", "adopting", "ready")
    with Session(stage.db) as session:  # nothing was lost: nothing announced, no incident
        assert session.exec(select(OutboxEvent)).all() == []
        assert session.exec(select(Incident)).all() == []
