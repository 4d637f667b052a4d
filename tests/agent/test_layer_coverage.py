"""Coverage: measured per layer, engine and failure domain; pursued by the planner within its balance."""

from __future__ import annotations

import numpy as np
import pytest

from engine_agent.layer_coverage import coverage_of, units_of
from engine_agent.layer_placement import COVERAGE_BALANCE, rebalance_layers
from engine_agent.placement import validate_placement


def skewed(layers: int, experts: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    profile = 1000.0 / np.arange(1, experts + 1)
    return np.stack([rng.permutation(profile) * rng.uniform(0.8, 1.2, experts) for _ in range(layers)])


@pytest.mark.parametrize(
    ("placement", "domains", "engine", "domain", "by_engine", "by_domain"),
    [
        # Every expert on two engines, but 0 only on host a and 3 only on host b.
        ([[0, 1], [0, 2], [1, 3], [2, 3]], ["a", "a", "b", "b"], 0, 2, [0, 0, 0, 0], {"a": 1, "b": 1}),
        # Hosts interleaved: the same placement survives either host.
        ([[0, 1], [0, 2], [1, 3], [2, 3]], ["a", "b", "b", "a"], 0, 0, [0, 0, 0, 0], {}),
        # No redundancy: each engine alone holds its two experts.
        ([[0, 1], [2, 3]], ["a", "b"], 4, 4, [2, 2], {"a": 2, "b": 2}),
        # One host: only engine losses count, domains are not reported.
        ([[0, 1], [0, 2], [1, 3], [2, 3]], ["a", "a", "a", "a"], 0, None, [0, 0, 0, 0], {}),
        # Expert 3 held twice by one engine (doubled up) is still one engine's loss away.
        ([[0, 1], [2, 0], [3, 3]], None, 3, None, [1, 1, 1], {}),
    ],
)
def test_coverage_counts_experts_one_loss_away_per_engine_and_domain(
    placement: list[list[int]],
    domains: list[str] | None,
    engine: int,
    domain: int | None,
    by_engine: list[int],
    by_domain: dict[str, int],
) -> None:
    report = coverage_of(np.array([placement]), 4, domains)
    assert report.at_risk_engine == engine
    assert report.at_risk_domain == domain
    assert report.by_engine.tolist() == by_engine
    assert report.by_domain == by_domain
    assert report.covered == (engine == 0 and not domain)


def test_the_record_names_engines_and_domains_of_the_single_replicas() -> None:
    report = coverage_of(np.array([[[0, 1], [2, 3]]]), 4, ["h1", "h2"])
    record = report.record(["e0", "e1"], ["h1", "h2"])
    assert record["covered"] is False
    assert record["at_risk"] == 4 and record["at_risk_domain"] == 4
    assert record["by_engine"] == {"e0": 2, "e1": 2}
    assert record["by_domain"] == {"h1": 2, "h2": 2}
    examples = record["examples"]
    assert isinstance(examples, list)
    assert examples[0] == {"layer": 0, "expert": 0, "engine": "e0", "domain": "h1"}
    assert record["domain_key"] == "data_host"


@pytest.mark.parametrize(
    ("domains", "units", "by_domain"),
    [(None, [0, 1, 2], False), (["a", "a", "a"], [0, 1, 2], False), (["b", "a", "b"], [1, 0, 1], True)],
)
def test_units_are_domains_where_the_engines_span_two(
    domains: list[str] | None, units: list[int], by_domain: bool
) -> None:
    unit, are_domains = units_of(domains, 3)
    assert unit.tolist() == units and are_domains == by_domain


def test_with_a_slot_for_a_second_replica_of_every_expert_a_fresh_plan_covers_every_engine_loss() -> None:
    plan = rebalance_layers(np.ones((3, 16)), 16, 4)
    assert plan.coverage is not None and plan.coverage.covered
    assert (plan.balance == 1.0).all()


def test_replicas_spread_over_hosts_so_that_a_host_loss_loses_no_expert() -> None:
    domains = ["a", "a", "b", "b"]
    plan = rebalance_layers(np.ones((2, 16)), 16, 4, domains=domains)
    assert plan.coverage is not None and plan.coverage.at_risk_domain == 0
    free = rebalance_layers(np.ones((2, 16)), 16, 4, domains=domains, coverage=False)
    assert free.coverage is not None and free.coverage.at_risk_domain, "without, some stay on one host"


def test_under_a_skewed_load_coverage_takes_only_what_the_balance_allows() -> None:
    loads = skewed(4, 32, seed=2)
    free = rebalance_layers(loads, 32, 8, coverage=False)
    covered = rebalance_layers(loads, 32, 8)
    assert covered.coverage is not None and free.coverage is not None
    assert covered.coverage.at_risk_engine < free.coverage.at_risk_engine
    assert (covered.balance >= 0.98 * COVERAGE_BALANCE * covered.fresh_balance - 1e-9).all()


def test_after_losing_an_engine_the_survivors_are_covered_again_for_few_copies_more_than_it_held() -> None:
    loads = np.ones((2, 16))
    start = rebalance_layers(loads, 16, 4)
    assert start.coverage is not None and start.coverage.covered
    lost = 1
    survivors = [rank for rank in range(4) if rank != lost]
    plan = rebalance_layers(loads, 16, 3, previous=start.placement, origin=survivors)
    assert plan.coverage is not None and plan.coverage.covered
    for layer in plan.to_lists():
        validate_placement(layer, 16)
    # The survivors hold one replica of what the lost engine held: each needs its second one back, and
    # the slot left over (33 for 32 replicas) takes one more.
    needed = sum(len(set(layer[lost])) + 1 for layer in start.to_lists())
    assert needed <= plan.copies_moved <= 1.5 * needed


def test_an_unchanged_covered_deployment_moves_nothing() -> None:
    loads = skewed(3, 24, seed=4)
    first = rebalance_layers(loads, 24, 6, domains=["a", "b"] * 3)
    again = rebalance_layers(loads, 24, 6, previous=first.placement, domains=["a", "b"] * 3)
    assert again.copies_moved == 0
    np.testing.assert_array_equal(again.placement, first.placement)
