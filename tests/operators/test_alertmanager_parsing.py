"""Alertmanager v4 payloads -> scale asks, one per deployment named, each with the identity that makes a
repeat a duplicate (pure parsing, no database)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.scale.hooks.alertmanager import (
    MAX_DEPLOYMENTS_PER_NOTIFICATION,
    AlertmanagerPayload,
    parse_step,
    plan,
)
from tests.operators.alertmanager_payloads import alert, firing_payload, payload, resolved_payload


def test_firing_alert_with_target_label_becomes_one_intent() -> None:
    result = plan(AlertmanagerPayload.model_validate(firing_payload("d1", target_dp_size=4)))
    assert [(i.deployment, i.target_dp_size, i.step) for i in result.asks] == [("d1", 4, None)]
    assert "MoEQueueTooLong" in result.asks[0].reason
    assert result.skipped == []


def test_target_may_come_from_an_annotation() -> None:
    body = payload([alert(deployment="d1", annotations={"target_dp_size": "3"})])
    assert plan(AlertmanagerPayload.model_validate(body)).asks[0].target_dp_size == 3


@pytest.mark.parametrize(
    ("labels", "step"),
    [
        ({"scale": "up"}, 1),
        ({"scale": "down"}, -1),
        ({"step": "+2"}, 2),
        ({"step": "-1"}, -1),
        ({"scale": "down", "step": "2"}, -2),
    ],
)
def test_scale_and_step_labels_become_a_signed_step(labels: dict[str, str], step: int) -> None:
    body = payload([alert(deployment="d1", labels=labels)])
    assert plan(AlertmanagerPayload.model_validate(body)).asks[0].step == step


def test_a_deployment_named_only_by_resolved_alerts_is_asked_to_withdraw() -> None:
    result = plan(AlertmanagerPayload.model_validate(resolved_payload("d1")))
    [ask] = result.asks
    assert (ask.deployment, ask.resolved, ask.target_dp_size, ask.step) == ("d1", True, None, None)
    assert result.skipped == []


def test_a_resolved_alert_beside_a_firing_one_does_not_withdraw() -> None:
    body = payload(
        [
            alert(deployment="d1", labels={"scale": "up", "instance": "a"}),
            alert(deployment="d1", status="resolved", labels={"scale": "up", "instance": "b"}),
        ]
    )
    [ask] = plan(AlertmanagerPayload.model_validate(body)).asks
    assert (ask.resolved, ask.step) == (False, 1)


def test_alert_without_deployment_label_is_skipped() -> None:
    body = payload([alert(deployment=None, labels={"scale": "up"})])
    result = plan(AlertmanagerPayload.model_validate(body))
    assert result.asks == [] and "deployment" in result.skipped[0].reason


@pytest.mark.parametrize(
    ("labels", "words"),
    [
        ({}, "names no"),
        ({"target_dp_size": "four"}, "positive integer"),
        ({"target_dp_size": "0"}, "positive"),
        ({"step": "0"}, "zero"),
        ({"scale": "sideways"}, "neither"),
        ({"scale": "up", "step": "-1"}, "contradicts"),
    ],
)
def test_alert_with_unusable_scale_labels_is_skipped_with_the_reason(
    labels: dict[str, str], words: str
) -> None:
    result = plan(AlertmanagerPayload.model_validate(payload([alert(deployment="d1", labels=labels)])))
    assert result.asks == [] and words in result.skipped[0].reason


def test_alerts_disagreeing_on_one_deployment_scale_nothing() -> None:
    body = payload(
        [
            alert(deployment="d1", alertname="A", labels={"target_dp_size": "4"}),
            alert(deployment="d1", alertname="B", labels={"target_dp_size": "2"}),
        ]
    )
    result = plan(AlertmanagerPayload.model_validate(body))
    assert result.asks == [] and "disagree" in result.skipped[0].reason


def test_one_payload_may_scale_two_deployments() -> None:
    body = payload(
        [
            alert(deployment="d1", labels={"scale": "up"}),
            alert(deployment="d2", labels={"scale": "down"}),
        ]
    )
    result = plan(AlertmanagerPayload.model_validate(body))
    assert sorted((i.deployment, i.step) for i in result.asks) == [("d1", 1), ("d2", -1)]


def identity_of(body: dict[str, object]) -> str | None:
    return plan(AlertmanagerPayload.model_validate(body)).asks[0].identity


def test_a_repeat_of_a_notification_has_the_same_identity() -> None:
    assert identity_of(firing_payload("d1", target_dp_size=4)) == identity_of(
        firing_payload("d1", target_dp_size=4)
    )


def test_a_new_firing_episode_has_a_new_identity() -> None:
    later = firing_payload("d1", scale="up", starts_at="2026-11-29T11:00:00Z")
    assert identity_of(firing_payload("d1", scale="up")) != identity_of(later)


def test_an_alert_joining_the_group_makes_a_new_identity_of_the_same_stream() -> None:
    one = alert(deployment="d1", labels={"step": "-1", "instance": "a"})
    two = alert(deployment="d1", labels={"step": "-1", "instance": "b"})
    first = plan(AlertmanagerPayload.model_validate(payload([one]))).asks[0]
    joined = plan(AlertmanagerPayload.model_validate(payload([one, two]))).asks[0]
    assert first.identity != joined.identity and first.stream == joined.stream


def test_the_resolution_of_a_group_is_not_its_firing_identity() -> None:
    assert identity_of(resolved_payload("d1")) != identity_of(firing_payload("d1", target_dp_size=4))


def test_another_group_is_another_stream() -> None:
    body = firing_payload("d1", scale="up")
    other = {**body, "groupKey": '{}:{alertname="Other"}'}
    assert plan(AlertmanagerPayload.model_validate(body)).asks[0].stream != (
        plan(AlertmanagerPayload.model_validate(other)).asks[0].stream
    )


def test_one_notification_decides_for_a_bounded_number_of_deployments() -> None:
    body = payload([alert(deployment=f"d{i}", labels={"scale": "up"}) for i in range(2000)])
    result = plan(AlertmanagerPayload.model_validate(body))
    assert len(result.asks) == MAX_DEPLOYMENTS_PER_NOTIFICATION
    assert sum(result.beyond_cap.values()) == 2000 - MAX_DEPLOYMENTS_PER_NOTIFICATION


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.update(version="3"),
        lambda b: b.pop("groupKey"),
        lambda b: b.update(alerts=[]),
        lambda b: b["alerts"][0].update(status="pending"),
        lambda b: b.update(alerts="x"),
    ],
)
def test_payload_not_in_v4_shape_is_invalid(mutate: object) -> None:
    body = firing_payload("d1", scale="up")
    mutate(body)  # type: ignore[operator]
    with pytest.raises(ValidationError):
        AlertmanagerPayload.model_validate(body)


@pytest.mark.parametrize(("text", "value"), [("+1", 1), ("-3", -3), ("2", 2), (" + 4 ", 4)])
def test_parse_step_reads_signed_integers(text: str, value: int) -> None:
    assert parse_step(text) == value


@pytest.mark.parametrize("text", ["", "up", "1.5", "0", "++1"])
def test_parse_step_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError):
        parse_step(text)
