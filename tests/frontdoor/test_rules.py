"""The front door's rules, as a table: each engine's state from the record alone."""

from __future__ import annotations

import pytest

from app.frontdoor.rules import (
    EndpointState,
    EngineFacts,
    JobFacts,
    as_switched,
    endpoint_of,
    rank_set,
    roles_of,
    switch_of,
)

GEN = 3
R, D, OUT = EndpointState.ready, EndpointState.draining, EndpointState.out


def engine(
    state: str = "serving", rank: int | None = 0, generation: int = GEN, engine_id: str = "e0"
) -> EngineFacts:
    return EngineFacts(engine_id, "http://127.0.0.1:9000", state, rank, generation)


def job(state: str, role: str | None = None, engine_id: str = "e0") -> JobFacts:
    return JobFacts("rcfg_1", state, {engine_id: role} if role else {})


CASES = [
    # (what, engine, job, expected state, expected reason)
    ("a member serving, no job", engine(), None, R, None),
    (
        "a member paused by a job's commit holds its requests",
        engine("paused"),
        job("committing", "staying"),
        R,
        None,
    ),
    ("a member paused in a blocking prepare", engine("paused"), job("preparing", "staying"), R, None),
    ("a member paused with no job (a lease outliving it)", engine("paused"), None, OUT, "paused"),
    ("a member paused after its job ended", engine("paused"), job("rolled_back", "staying"), OUT, "paused"),
    ("a leaver once the plan names it", engine(), job("preparing", "leaving"), D, "leaving in job rcfg_1"),
    (
        "a leaver while the job is pending with its plan",
        engine(),
        job("pending", "leaving"),
        D,
        "leaving in job rcfg_1",
    ),
    (
        "a leaver paused inside the commit",
        engine("paused"),
        job("committing", "leaving"),
        D,
        "leaving in job rcfg_1",
    ),
    ("a leaver of a rolled-back job is back", engine(), job("rolled_back", "leaving"), R, None),
    ("a leaver of a cancelled job is back", engine(), job("cancelled", "leaving"), R, None),
    ("a joiner before its switch", engine("idle", None, 0), job("syncing", "joining"), OUT, "joining"),
    (
        "a joiner inside the commit, not yet recorded",
        engine("serving", 2, GEN),
        job("committing", "joining"),
        R,
        None,
    ),
    (
        "a joiner switched on the next generation, not yet recorded",
        engine("serving", 2, GEN + 1),
        job("committing", "joining"),
        OUT,
        "joining",
    ),
    (
        "a joiner of a rolled-back job",
        engine("idle", None, 0),
        job("rolled_back", "joining"),
        OUT,
        "not-a-member",
    ),
    ("an idle engine in no job", engine("idle", None, 0), None, OUT, "not-a-member"),
    ("an engine just registered", engine("registered", None, 0), None, OUT, "not-a-member"),
    ("a fenced member", engine("fenced"), None, OUT, "fenced"),
    ("an unreachable member", engine("unreachable"), job("committing", "staying"), OUT, "unreachable"),
    ("a member on an older generation", engine("serving", 0, GEN - 1), None, OUT, "not-a-member"),
]


@pytest.mark.parametrize(("what", "facts", "job_facts", "state", "reason"), CASES, ids=[c[0] for c in CASES])
def test_front_door_state(
    what: str, facts: EngineFacts, job_facts: JobFacts | None, state: EndpointState, reason: str | None
) -> None:
    endpoint = endpoint_of(facts, GEN, job_facts)
    assert endpoint is not None
    assert (endpoint.state, endpoint.reason) == (state, reason), what


LEFT = [
    # (what, engine, job, the deployment has a serving generation, expected (state, reason) or None)
    ("a member written off as lost, before any heal", engine("left", None, GEN), None, True, (OUT, "lost")),
    (
        "a member written off while its heal job runs",
        engine("left", None, GEN),
        job("syncing", None),
        True,
        (OUT, "lost"),
    ),
    ("an engine that left before serving", engine("left", None, 0), None, True, None),
    ("a leaver after its switch, released", engine("left", None, GEN - 1), None, True, None),
    ("a lost member once a generation formed without it", engine("left", None, GEN - 1), None, True, None),
    ("a stopped deployment's engine", engine("left", None, GEN), None, False, None),
]


@pytest.mark.parametrize(("what", "facts", "job_facts", "formed", "expected"), LEFT, ids=[c[0] for c in LEFT])
def test_an_engine_that_left_is_out_while_its_generation_serves_then_not_listed(
    what: str,
    facts: EngineFacts,
    job_facts: JobFacts | None,
    formed: bool,
    expected: tuple[EndpointState, str] | None,
) -> None:
    endpoint = endpoint_of(facts, GEN, job_facts, formed)
    assert (None if endpoint is None else (endpoint.state, endpoint.reason)) == expected, what


def test_a_lost_member_is_dropped_by_the_switch_of_the_job_that_heals_without_it() -> None:
    """Lost (written off) while the survivors serve on: out; the heal's observed commit (every member
    on the next generation) drops it from that version on, as the recorded move will."""
    lost, survivor = engine("left", None, GEN, "a"), engine("idle", None, GEN, "b")
    assert [(e.engine_id, e.state, e.reason) for e in rank_set(GEN, [lost, survivor], None)] == [
        ("a", OUT, "lost"),
        ("b", OUT, "not-a-member"),
    ]
    healed = JobFacts("rcfg_2", "committing", {"b": "staying"}, GEN + 1, {"b": 0})
    assert [(e.engine_id, e.state) for e in rank_set(GEN, [lost, survivor], healed)] == [("b", R)]


def test_the_rank_set_lists_ready_engines_by_rank_first() -> None:
    engines = [
        engine("idle", None, 0, "z-joiner"),
        engine("serving", 1, GEN, "b"),
        engine("serving", 0, GEN, "c"),
        engine("fenced", 2, GEN, "a"),
    ]
    listed = rank_set(GEN, engines, None)
    assert [(e.engine_id, e.state) for e in listed] == [("c", R), ("b", R), ("a", OUT), ("z-joiner", OUT)]


def test_roles_come_from_the_jobs_engine_results_and_skip_malformed_rows() -> None:
    results = [{"engine_id": "a", "role": "leaving"}, {"engine_id": "b"}, {"role": "joining"}]
    assert roles_of(results) == {"a": "leaving"}
    assert roles_of(None) == {}


def test_a_leaver_of_a_job_ending_on_the_old_generation_stays_before_the_job_ends() -> None:
    results = [
        {"engine_id": "a", "role": "leaving", "generation_before": 3, "generation_after": 3},
        {"engine_id": "b", "role": "leaving", "generation_before": 3, "generation_after": None},
    ]
    roles = roles_of(results)
    assert roles == {"a": "staying", "b": "leaving"}
    still_running = JobFacts("rcfg_1", "syncing", roles)
    assert endpoint_of(engine(engine_id="a"), GEN, still_running).state == R  # type: ignore[union-attr]
    assert endpoint_of(engine(engine_id="b"), GEN, still_running).state == D  # type: ignore[union-attr]


def result(engine_id: str, role: str, new_rank: int | None, before: int | None, after: int | None) -> dict:
    return {
        "engine_id": engine_id,
        "role": role,
        "new_rank": new_rank,
        "generation_before": before,
        "generation_after": after,
    }


SWITCHES = [
    # (what, results, expected (generation, ranks))
    (
        "every member ended on the new generation",
        [
            result("a", "staying", 0, GEN, GEN + 1),
            result("c", "leaving", None, GEN, None),
            result("d", "joining", 1, None, GEN + 1),
        ],
        (GEN + 1, {"a": 0, "d": 1}),
    ),
    (
        "still running (after not known yet)",
        [result("a", "staying", 0, GEN, None), result("d", "joining", 1, None, None)],
        (None, {}),
    ),
    (
        "ended on the old generation (a joiner released)",
        [result("a", "staying", 0, GEN, GEN), result("d", "joining", 1, None, None)],
        (None, {}),
    ),
    (
        "a switch that failed part-way",
        [result("a", "staying", 0, GEN, GEN + 1), result("b", "staying", 1, GEN, GEN)],
        (None, {}),
    ),
    ("no results", [], (None, {})),
]


@pytest.mark.parametrize(("what", "results", "expected"), SWITCHES, ids=[c[0] for c in SWITCHES])
def test_a_switch_is_read_from_the_results_only_when_every_member_switched(
    what: str, results: list[dict], expected: tuple[int | None, dict[str, int]]
) -> None:
    assert switch_of(results) == expected, what


def test_the_observed_commit_gives_the_rank_set_the_recorded_generation_will() -> None:
    """Published from the results (`committing`, rows not yet moved), then derived from the rows the
    move wrote (`cleaning_up`): the same endpoints and generation, so the move writes no new version."""
    results = [
        result("a", "staying", 1, GEN, GEN + 1),
        result("b", "staying", 0, GEN, GEN + 1),
        result("c", "leaving", None, GEN, None),
        result("d", "joining", 2, None, GEN + 1),
    ]
    switched_to, ranks = switch_of(results)
    facts = {"roles": roles_of(results), "switched_to": switched_to, "new_ranks": ranks}
    before_move = [
        engine("paused", 0, GEN, "a"),
        engine("paused", 1, GEN, "b"),
        engine("paused", 2, GEN, "c"),
        engine("serving", None, 0, "d"),  # a joiner's own row until the move
        engine("serving", 0, GEN, "e"),  # not in the job
    ]
    observed = JobFacts("rcfg_1", "committing", **facts)  # type: ignore[arg-type]
    after_move = [
        engine("serving", 1, GEN + 1, "a"),
        engine("serving", 0, GEN + 1, "b"),
        engine("idle", None, GEN, "c"),
        engine("serving", 2, GEN + 1, "d"),
        engine("serving", 0, GEN, "e"),
    ]
    recorded = JobFacts("rcfg_1", "cleaning_up", **facts)  # type: ignore[arg-type]
    published = rank_set(GEN, before_move, observed)
    assert published == rank_set(GEN + 1, after_move, recorded)
    assert as_switched(GEN, before_move, observed)[0] == as_switched(GEN + 1, after_move, recorded)[0]
    assert [(e.engine_id, e.state, e.dp_rank) for e in published if e.state == R] == [
        ("b", R, 0),
        ("a", R, 1),
        ("d", R, 2),
    ]
    assert {e.engine_id: e.reason for e in published if e.state == OUT} == {
        "c": "not-a-member",
        "e": "not-a-member",
    }


def test_a_switch_in_the_results_of_an_ended_job_changes_nothing() -> None:
    engines = [engine("serving", 0, GEN, "a")]
    failed = JobFacts("rcfg_1", "failed", {"a": "staying"}, GEN + 1, {"a": 0})
    assert as_switched(GEN, engines, failed) == (GEN, engines)
