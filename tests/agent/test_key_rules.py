"""The agent key's rules as tables, in-process with a fake clock (no agent process): which key opens
which route when, what the gate needs per path, the failure throttle and the refusal log."""

from __future__ import annotations

import logging
import time

import pytest
from pydantic import ValidationError

from engine_agent.auth import AgentKeys, Need, until_epoch
from engine_agent.gate import body_bound, need_of
from engine_agent.protocol import (
    MAX_CONTROL_BODY_BYTES,
    MAX_PREPARE_BODY_BYTES,
    AgentKeyRotation,
    key_check,
)
from engine_agent.settings import AgentSettings
from engine_agent.throttle import FailureThrottle, RefusalLog, retry_after_header

K1, K2, K3, DATA = ("k1-" + "a" * 20, "k2-" + "b" * 20, "k3-" + "c" * 20, "data-" + "d" * 20)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keys_at(clock: Clock, *, previous_for_s: float | None = None, data: str | None = None) -> AgentKeys:
    until = time.time() + previous_for_s if previous_for_s is not None else None
    return AgentKeys(K2, previous=K1 if until else None, previous_until=until, data_key=data, clock=clock)


@pytest.mark.parametrize(
    ("need", "key", "before_end", "after_end"),
    [
        (Need.control, K2, True, True),
        (Need.control, K1, True, False),  # the previous key, until its end only
        (Need.current, K2, True, True),
        (Need.current, K1, False, False),  # never rotates, even inside its overlap
        (Need.data, K1, True, True),  # no data key: /v1/infer is open
        (Need.control, None, False, False),
        (Need.control, K3, False, False),
        (Need.open, None, True, True),
    ],
)
def test_which_key_opens_which_route_before_and_after_the_overlap(
    need: Need, key: str | None, before_end: bool, after_end: bool
) -> None:
    clock = Clock()
    keys = keys_at(clock, previous_for_s=60)
    assert keys.accepts(need, key) is before_end
    clock.now += 61
    assert keys.accepts(need, key) is after_end


def test_with_a_data_key_the_previous_control_key_serves_infer_until_its_end_only() -> None:
    clock = Clock()
    keys = keys_at(clock, previous_for_s=60, data=DATA)
    assert [keys.accepts(Need.data, k) for k in (DATA, K2, K1, K3, None)] == [True, True, True, False, False]
    clock.now += 61
    assert [keys.accepts(Need.data, k) for k in (DATA, K2, K1, K3, None)] == [True, True, False, False, False]


def test_a_second_rotation_inside_the_overlap_ends_the_first_previous_key_at_once() -> None:
    clock = Clock()
    keys = keys_at(clock, previous_for_s=3600)
    keys.rotate(K3, 30)
    assert [keys.accepts(Need.control, k) for k in (K3, K2, K1)] == [True, True, False]
    assert keys.key_check() == key_check(K3) and keys.previous_for_s() == 30
    clock.now += 31
    assert [keys.accepts(Need.control, k) for k in (K3, K2, K1)] == [True, False, False]


def test_a_previous_key_needs_its_end() -> None:
    with pytest.raises(ValueError, match="EPCTL_AGENT_KEY_PREVIOUS_UNTIL"):
        AgentKeys(K2, previous=K1)
    with pytest.raises(ValidationError, match="EPCTL_AGENT_KEY_PREVIOUS_UNTIL"):
        AgentSettings(key=K2, key_previous=K1)
    with pytest.raises(ValidationError):
        AgentSettings(key=K2, key_previous=K1, key_previous_until="tomorrow")
    settings = AgentSettings(key=K2, key_previous=K1, key_previous_until="2020-01-01T00:00:00Z")
    assert not settings.agent_keys().accepts(Need.control, K1)  # its end has passed


@pytest.mark.parametrize(
    ("text", "epoch"),
    [("1700000000", 1700000000.0), ("1700000000.5", 1700000000.5), ("2023-11-14T22:13:20Z", 1700000000.0),
     ("2023-11-14T23:13:20+01:00", 1700000000.0)],
)  # fmt: skip
def test_the_end_is_epoch_seconds_or_an_iso_time_with_a_zone(text: str, epoch: float) -> None:
    assert until_epoch(text) == epoch


def test_an_end_without_a_zone_is_refused() -> None:
    with pytest.raises(ValueError, match="time zone"):
        until_epoch("2023-11-14T22:13:20")


def test_an_overlap_has_a_minimum_and_a_maximum() -> None:
    for overlap in (0.001, 9.9, 8 * 86400):
        with pytest.raises(ValidationError):
            AgentKeyRotation.model_validate({"key": K3, "overlap_s": overlap})
    assert AgentKeyRotation.model_validate({"key": K3, "overlap_s": 10}).overlap_s == 10


@pytest.mark.parametrize(
    ("path", "need"),
    [("/healthz", Need.open), ("/metrics", Need.open), ("/docs", Need.open), ("/openapi.json", Need.open),
     ("/docs/static/init.js", Need.open), ("/docs/static/../../v1/info", Need.control),
     ("/v1/infer", Need.data), ("/v1/agent-key", Need.current), ("/v1/info", Need.control),
     ("/v1/reconfig/prepare", Need.control), ("/v1/faults", Need.control), ("/redoc", Need.control),
     ("/anything", Need.control), ("/docs/../v1/info", Need.control)],
)  # fmt: skip
def test_what_each_path_needs(path: str, need: Need) -> None:
    assert need_of(path) is need


def test_a_dot_dot_path_under_docs_serves_no_control_route() -> None:
    """The gate opens one file name under /docs/static/; anything deeper is keyed (here: the agent is
    not started, so 503), never served."""
    from fastapi.testclient import TestClient

    from engine_agent.api import create_app

    client = TestClient(create_app(fault_injection=False))
    assert client.get("/docs/static/..%2F..%2Fv1%2Finfo").status_code == 503
    assert client.get("/docs/static/init.js").status_code == 200


def test_control_bodies_have_small_bounds() -> None:
    assert body_bound("/v1/reconfig/prepare") == MAX_PREPARE_BODY_BYTES <= 1024 * 1024
    assert (
        body_bound("/v1/reconfig/pause")
        == body_bound("/v1/agent-key")
        == MAX_CONTROL_BODY_BYTES
        < 1024 * 1024
    )


def test_the_throttle_counts_failures_per_address_and_refills() -> None:
    clock = Clock()
    throttle = FailureThrottle(burst=3, refill_s=2.0, clock=clock)
    for _ in range(3):
        assert throttle.retry_after("a") is None
        throttle.failed("a")
    assert throttle.retry_after("a") == pytest.approx(2.0)
    assert throttle.retry_after("b") is None  # another address is not throttled
    clock.now += 1.0
    assert throttle.retry_after("a") == pytest.approx(1.0)
    clock.now += 1.0
    assert throttle.retry_after("a") is None  # one failure regained
    throttle.failed("a")
    assert throttle.retry_after("a") is not None


def test_a_credential_that_worked_from_an_address_keeps_working_there_while_it_is_throttled() -> None:
    clock = Clock()
    throttle = FailureThrottle(burst=2, refill_s=1000.0, proven_ttl_s=100.0, clock=clock)
    for _ in range(1000):  # a busy client's own successes never throttle it
        throttle.succeeded("shared", b"good")
    assert throttle.retry_after("shared", b"good") is None
    throttle.failed("shared")
    throttle.failed("shared")  # a guesser behind the same address
    assert throttle.retry_after("shared", b"good") is None
    assert throttle.retry_after("shared", b"guess") is not None
    assert throttle.retry_after("shared", None) is not None
    clock.now += 101  # proven too long ago (and it did not come back): it waits like the rest
    assert throttle.retry_after("shared", b"good") is not None


def test_the_throttle_tracks_a_bounded_number_of_addresses() -> None:
    throttle = FailureThrottle(burst=1, max_clients=100, clock=Clock())
    for index in range(10_000):
        throttle.failed(f"10.0.{index // 256}.{index % 256}")
    assert len(throttle._clients) == 100
    assert throttle.retry_after("10.0.39.15") is not None  # the most recent are remembered


def test_a_zero_burst_throttles_nothing() -> None:
    throttle = FailureThrottle(burst=0)
    for _ in range(100):
        throttle.failed("a")
    assert throttle.retry_after("a") is None


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert [retry_after_header(s) for s in (0.0, 0.2, 1.0, 1.01, 59.5)] == ["1", "1", "1", "2", "60"]


def test_refusals_are_a_first_line_then_one_summary_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    refusals = RefusalLog(logging.getLogger("test.refusals"), interval_s=30.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for index in range(1000):
            clock.now += 0.05  # 1,000 refusals over 50 s
            refusals.refused("10.0.0.9" if index % 10 else "10.0.0.8", "wrong control key", "GET /v1/info")
        refusals.flush(force=True)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("refused GET /v1/info from 10.0.0.8: wrong control key")
    assert "10.0.0.9 x" in lines[1] and "wrong control key x" in lines[1]
    counted = sum(int(line.split()[1]) for line in lines[1:])
    assert counted == 999  # every refusal after the first is in a summary
    refusals.flush(force=True)
    assert len(caplog.records) == 3  # nothing left to say
