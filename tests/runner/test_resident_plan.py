"""After a loss, the plan serves from what the survivors hold (`app.backends.reference.resident`)."""

from __future__ import annotations

import pytest

from app.backends.reference.planner import DeploymentSpec, make_plan
from app.backends.reference.resident import Placements, kept_placement, resident_rows, spare_filled
from engine_agent.protocol import AgentInfo, ResidentRows
from tests.runner.test_planner import agent

# Generation 3 on four engines, every expert on two of them: any one loss is covered.
COVERED = [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 4, 5], [2, 3, 6, 7]]
# Generation 3 on two engines, no redundancy: a loss takes four experts.
BARE = [[0, 1, 2, 3], [4, 5, 6, 7]]
# Generation 3 on four engines, no redundancy: two experts each.
BARE4 = [[0, 1], [2, 3], [4, 5], [6, 7]]


def survivor(engine_id: str, rank: int, placement: list[list[int]], *, generation: int = 3) -> AgentInfo:
    info = agent(engine_id, rank=None, generation=0, port=10 + rank)
    return info.model_copy(
        update={"resident": ResidentRows(generation=generation, rank=rank, placements=[placement])}
    )


def spec(redundant: int) -> DeploymentSpec:
    return DeploymentSpec(
        name="demo", num_logical_experts=8, num_redundant_experts=redundant, generation=3, expert_nbytes=1000
    )


@pytest.mark.parametrize(
    ("holders", "expected"),
    [
        # (rank held in generation 3, or None: holds nothing), ... -> (previous rows, origin)
        ([0, 2, 1], ([[COVERED[0], COVERED[2], COVERED[1]]], [0, 1, 2])),
        ([None, 1], ([[COVERED[1]]], [None, 0])),
        ([None, None], None),
    ],
)
def test_resident_rows_are_the_old_rows_of_the_members_that_hold_them(
    holders: list[int | None], expected: tuple[Placements, list[int | None]] | None
) -> None:
    infos = [
        survivor(f"e{i}", rank, COVERED) if rank is not None else agent(f"e{i}", rank=None, generation=0)
        for i, rank in enumerate(holders)
    ]
    assert resident_rows(3, infos, 1) == expected


@pytest.mark.parametrize(
    "info",
    [
        survivor("e0", 0, COVERED, generation=2),  # rows of an older generation
        survivor("e0", 7, COVERED),  # a rank the placement does not have
        survivor("e0", 0, COVERED).model_copy(  # two layers for a one-layer deployment
            update={"resident": ResidentRows(generation=3, rank=0, placements=[COVERED, COVERED])}
        ),
    ],
)
def test_rows_that_do_not_fit_are_ignored(info: AgentInfo) -> None:
    assert resident_rows(3, [info], 1) is None


def test_nothing_is_resident_before_a_first_generation() -> None:
    assert resident_rows(0, [survivor("e0", 0, COVERED, generation=0)], 1) is None


@pytest.mark.parametrize(
    ("previous", "origin", "kept"),
    [
        ([[COVERED[0], COVERED[1], COVERED[2]]], [0, 1, 2], [[COVERED[0], COVERED[1], COVERED[2]]]),
        ([[COVERED[0], COVERED[1], COVERED[2]]], [2, 0, 1], [[COVERED[2], COVERED[0], COVERED[1]]]),
        ([[BARE[0]]], [0], None),  # the loss took experts 4..7: they must load
        ([[COVERED[0], COVERED[1]]], [0, 1, None], None),  # a member holds nothing: it must load
        ([], [], None),
    ],
)
def test_a_covered_loss_keeps_the_rows_as_they_are(
    previous: Placements, origin: list[int | None], kept: Placements | None
) -> None:
    assert kept_placement(previous, origin, 8) == kept


def test_a_covered_loss_plans_no_copy_at_all() -> None:
    survivors = [survivor("e0", 0, COVERED), survivor("e1", 1, COVERED), survivor("e2", 2, COVERED)]
    plan = make_plan(spec(8), survivors, 3)
    assert plan.old_members == [] and plan.joiners == ["e0", "e1", "e2"]
    assert plan.placement == COVERED[:3]
    stats = plan.placement_stats
    assert (stats["copies_moved"], stats["bytes_moved"], stats["source"]) == (0, 0, "resident")
    assert plan.coverage["covered"] is False  # the loss took the second replica of 2, 3, 6, 7


def test_an_uncovered_loss_loads_only_what_the_loss_took() -> None:
    plan = make_plan(spec(0), [survivor("e0", 0, BARE)], 1)
    stats = plan.placement_stats
    assert (stats["copies_moved"], stats["bytes_moved"], stats["source"]) == (4, 4000, "resident")
    assert set(plan.placement[0]) == set(range(8))


def test_without_resident_rows_every_expert_loads() -> None:
    idle = [agent("e0", rank=None, generation=0, port=10)]
    stats = make_plan(spec(0), idle, 1).placement_stats
    assert stats["copies_moved"] == 8 and "source" not in stats


# --- warm spares (issue 38): a spare takes the lost rank's rows ------------------------------------------


def spare(engine_id: str, port: int = 30) -> AgentInfo:
    return agent(engine_id, rank=None, generation=0, port=port).model_copy(update={"spare_bytes": 8000})


def held(*ranks: int) -> list[AgentInfo]:
    """The survivors of generation 3 on BARE4 holding these ranks' rows."""
    return [survivor(f"e{rank}", rank, BARE4) for rank in ranks]


@pytest.mark.parametrize(
    ("infos", "expected"),
    [
        # ranks 0, 2 and 3 survive, rank 1 was lost: the spare takes rank 1's rows
        ([*held(0, 2, 3), spare("s0")], [[BARE4[0], BARE4[2], BARE4[3], BARE4[1]]]),
        # the spare first in the order given: its rows are still the lost rank's
        ([spare("s0"), *held(1, 2, 3)], [BARE4]),
        ([*held(0, 1), spare("s0"), spare("s1", 31)], [[BARE4[0], BARE4[1], BARE4[2], BARE4[3]]]),  # 2 lost
        (held(0, 1, 2), None),  # no spare: not this rule
        ([*held(0, 1, 2), spare("s0"), spare("s1", 31)], None),  # 2 spares for 1 lost rank
        ([*held(0, 1, 2), agent("f0", rank=None, generation=0, port=40)], None),  # holds nothing
        ([spare("s0")], None),  # no survivor: nothing to take the rows from
    ],
)
def test_a_spare_fills_the_lost_ranks_rows(infos: list[AgentInfo], expected: Placements | None) -> None:
    assert spare_filled(3, infos, 1) == expected


def test_an_uncovered_loss_healed_on_a_spare_loads_nothing() -> None:
    """Without redundancy the survivors alone would load the lost experts; with a warm spare the plan is
    the broken generation's, unchanged: nothing moves (the spare copies its rows from what it holds)."""
    infos = [survivor("e0", 0, BARE4), survivor("e1", 1, BARE4), survivor("e3", 3, BARE4), spare("s0")]
    plan = make_plan(spec(0), infos, 4)
    assert plan.joiners == ["e0", "e1", "e3", "s0"] and plan.placement == [
        BARE4[0],
        BARE4[1],
        BARE4[3],
        BARE4[2],
    ]
    stats = plan.placement_stats
    assert (stats["copies_moved"], stats["bytes_moved"], stats["source"]) == (0, 0, "spare")


def test_survivors_join_before_spares_and_spares_before_other_idle_engines() -> None:
    fresh = agent("a-fresh", rank=None, generation=0, port=41)
    infos = [fresh, spare("b-spare"), survivor("c0", 0, BARE), survivor("c1", 1, BARE)]
    plan = make_plan(spec(0), infos, 3)
    assert plan.joiners == ["c0", "c1", "b-spare"]
