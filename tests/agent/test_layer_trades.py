"""The planner's inner steps, as tables: the swap-down's trades and the coverage pass's other-holders peak."""

from __future__ import annotations

import numpy as np
import pytest

from engine_agent.layer_cover import _other_holders_peak
from engine_agent.layer_fresh import held_pairs
from engine_agent.layer_moves import _make_room
from engine_agent.layer_trades import swap_down

INF = float("inf")


@pytest.mark.parametrize(
    ("slots", "loads", "expected"),
    [
        # one holder each: nobody else
        ([0, 1, 2], [5.0, 3.0, 1.0], [-INF, -INF, -INF]),
        # expert 0 on two ranks: each sees the other
        ([0, 1, 0], [5.0, 3.0, 1.0], [1.0, -INF, 5.0]),
        # three holders: the heaviest sees the second, the others see the heaviest
        ([4, 4, 4, 2], [2.0, 7.0, 3.0, 9.0], [7.0, 3.0, 7.0, -INF]),
        # two holders at the same load: each sees that load
        ([3, 3, 1], [4.0, 4.0, 8.0], [4.0, 4.0, -INF]),
        # an expert doubled on one rank (one held pair, two slots): the other slot is at the same load
        ([6, 6, 5], [2.0, 2.0, 2.0], [2.0, 2.0, -INF]),
    ],
)
def test_the_other_holders_peak_is_the_heaviest_other_slot_of_the_same_expert(
    slots: list[int], loads: list[float], expected: list[float]
) -> None:
    got = _other_holders_peak(np.array([slots]), np.array([loads]), 8)
    assert got.tolist() == [expected]


def swapped(
    placement: list[list[int]], loads: list[float], target: float, kept: list[list[int]] | None = None
) -> tuple[list[list[int]], bool]:
    """One layer through `swap_down`: (its sorted placement, whether it stayed over target)."""
    layout = np.array([placement], dtype=np.int64)
    num_logical = len(loads)
    weights = np.array([loads])
    held = held_pairs(layout, num_logical)
    was = layout if kept is None else np.array([kept], dtype=np.int64)
    rank_load = (held * weights[:, None, :]).sum(axis=2)
    over = swap_down(layout, rank_load, held, held_pairs(was, num_logical), weights, np.array([target]))
    return np.sort(layout[0], axis=1).tolist(), bool(over[0])


@pytest.mark.parametrize(
    ("placement", "loads", "target", "kept", "expected"),
    [
        # the heavy rank trades a replica for a lighter one (equal outcomes: its first slot's)
        ([[0, 1], [2, 3]], [6.0, 5.0, 1.0, 1.0], 8.0, None, ([[1, 2], [0, 3]], False)),
        # under target already: nothing moves
        ([[0, 1], [2, 3]], [4.0, 3.0, 2.0, 2.0], 8.0, None, ([[0, 1], [2, 3]], False)),
        # no trade lowers the heavy rank without lifting the other to where it was: nothing moves
        ([[0], [1], [2]], [9.0, 1.0, 1.0], 5.0, None, ([[0], [1], [2]], True)),
        # two trades reach the target; the one that moves no copy wins: rank 1 held expert 0 before
        (
            [[0, 1], [2, 3], [4, 5]],
            [4.0, 4.0, 1.0, 1.0, 1.0, 1.0],
            6.5,
            [[0, 1], [0, 3], [4, 5]],
            ([[1, 2], [0, 3], [4, 5]], False),
        ),
    ],
)
def test_the_swap_down_trades_the_fewest_copies_until_the_heaviest_rank_is_under_target(
    placement: list[list[int]],
    loads: list[float],
    target: float,
    kept: list[list[int]] | None,
    expected: tuple[list[list[int]], bool],
) -> None:
    assert swapped(placement, loads, target, kept) == expected


def test_make_room_gives_an_orphan_the_replica_whose_loss_leaves_the_lowest_peak_first_on_ties() -> None:
    """Two layers at once, each with expert 2 held by nobody and no free slot (2 ranks x 2 slots, both
    holding experts 0 and 1). Layer 0, equal loads: every replica scores the same, so the first pair
    (rank 0, expert 0) gives way. Layer 1, loads 6/2/1: dropping a replica of expert 0 would leave its
    other holder at 4 + 3 = 7, of expert 1 at 4 + 1 = 5, so expert 1 on rank 0 (the first of the tie
    between the ranks) gives way."""
    held = np.array([[[True, True, False], [True, True, False]]] * 2)
    loads = np.array([[4.0, 4.0, 1.0], [6.0, 2.0, 1.0]])
    _make_room(held, loads, 2)
    assert held.astype(int).tolist() == [
        [[0, 1, 1], [1, 1, 0]],
        [[1, 0, 1], [1, 1, 0]],
    ]
