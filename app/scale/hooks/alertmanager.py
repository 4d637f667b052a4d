"""Prometheus Alertmanager webhook (payload version 4) -> scale asks.

Alertmanager sends one notification per alert group: again every `repeat_interval` while nothing
changes, at once (after `group_interval`) when an alert joins or leaves the group or resolves, and
again after a 5xx. So a notification is identified by what it asks, per deployment it names: (group
key, deployment, the set of its firing alerts' fingerprints with their `startsAt`, status). A repeat of
an identity is a duplicate; a new identity (an alert joined or left, a new firing episode) is a new
intent of the group's stream, which replaces the group's standing one. A deployment named only by
resolved alerts, or no longer named at all, has its group's intent withdrawn (`app.scale.hooks.decide`).
Alerts that cannot be acted on are returned with the reason, never raised.

Labels and annotations an alert uses (alert-level values override the common ones); the docs'
"Alertmanager" section lists them too:
- `deployment` (label, required): the deployment to scale;
- `target_dp_size` (label or annotation): an absolute target, 1..1024;
- or `step` (`+1`, `-2`, `2`) and/or `scale` (`up` | `down`): relative; within one firing episode of
  the group it counts from where the deployment was when the episode began (an alert joining the group
  asks for the same size), else from where it is heading (an active job's target, else its size);
  `scale` alone is a step of 1.
- `alertname` (label): named in the recorded reason. Every other label is ignored.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEPLOYMENT_LABEL = "deployment"
TARGET_KEY = "target_dp_size"
STEP_KEY = "step"
SCALE_KEY = "scale"

MAX_DP_SIZE = 1024  # no size, target or step beyond this is meaningful (the API's own limit)
# ASCII digits only: `str.isdigit` and `\d` accept "²" or "٣", which int() then refuses (a 500, once).
_STEP_RE = re.compile(r"^\s*([+-]?)\s*([0-9]{1,4})\s*$", re.ASCII)
_TARGET_RE = re.compile(r"^[0-9]{1,4}$", re.ASCII)
_GROUP_KEY_LIMIT = 8192
_TEXT_LIMIT = 8192
# One notification decides for at most this many deployments; the alerts of the others are recorded as a
# count (a group should name one deployment: `group_by: [alertname, deployment]`).
MAX_DEPLOYMENTS_PER_NOTIFICATION = 32
# Skipped alerts are recorded per (deployment, reason), at most this many records per notification.
MAX_SKIP_RECORDS = 16
MAX_FINGERPRINTS_SHOWN = 20


class AlertmanagerAlert(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: datetime | None = None
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = Field("", max_length=256)


class AlertmanagerPayload(BaseModel):
    """Alertmanager's webhook body, version 4 (alertmanager/notify/webhook)."""

    model_config = ConfigDict(extra="allow")

    version: Literal["4"]
    groupKey: str = Field(min_length=1, max_length=_GROUP_KEY_LIMIT)
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = Field("", max_length=_TEXT_LIMIT)
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AlertmanagerAlert] = Field(min_length=1)


def intent_stream_key(source: str, key: str) -> str:
    """The stream an ask belongs to: its intents replace each other (per deployment)."""
    return hashlib.sha256(f"{source}\n{key}".encode()).hexdigest()


@dataclass(frozen=True)
class ScaleAsk:
    """What one request asks of one deployment: an absolute target or a signed step, or (resolved) the
    withdrawal of its stream's standing intent."""

    deployment: str
    target_dp_size: int | None
    step: int | None
    reason: str
    stream: str
    identity: str | None = None  # what makes a repeat a duplicate (None: every request is new)
    resolved: bool = False
    anchored: bool = False  # a step counts from the anchor of its stream's standing intent
    fingerprints: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.resolved:
            return "resolved"
        if self.target_dp_size is not None:
            return f"target_dp_size={self.target_dp_size}"
        return f"step={self.step:+d}" if self.step is not None else "nothing"


@dataclass(frozen=True)
class SkippedAlert:
    """An alert (or group of alerts) that will not scale anything, and why."""

    deployment: str | None
    reason: str
    fingerprints: tuple[str, ...] = ()
    resolved: bool = False  # merely resolved (ignored); otherwise its labels are unusable (rejected)


@dataclass
class AlertmanagerPlan:
    asks: list[ScaleAsk] = field(default_factory=list)
    skipped: list[SkippedAlert] = field(default_factory=list)
    stream: str = ""
    named: set[str] = field(default_factory=set)  # every deployment the notification names
    beyond_cap: dict[str, int] = field(default_factory=dict)  # deployment -> alerts not decided


def alert_identity(alert: AlertmanagerAlert) -> str:
    """`fingerprint@startsAt`; Alertmanager always sends a fingerprint, but compute one if absent."""
    fingerprint = (
        alert.fingerprint or hashlib.sha256(repr(sorted(alert.labels.items())).encode()).hexdigest()[:16]
    )
    started = alert.startsAt.isoformat() if alert.startsAt else ""
    return f"{fingerprint}@{started}"


def notification_identity(
    group_key: str, deployment: str, status: str, alerts: list[AlertmanagerAlert]
) -> str:
    """(group key, deployment, status, the alerts' fingerprints with their start times), hashed."""
    material = "\n".join([group_key, deployment, status, *sorted(alert_identity(a) for a in alerts)])
    return hashlib.sha256(material.encode()).hexdigest()


def parse_step(text: str) -> int:
    """`+2`, `-1`, `2` -> signed int; raises ValueError on anything else (zero included)."""
    match = _STEP_RE.match(text)
    if not match:
        raise ValueError(f"step {text[:40]!r} is not a signed integer from -{MAX_DP_SIZE} to +{MAX_DP_SIZE}")
    value = int(match.group(2)) * (-1 if match.group(1) == "-" else 1)
    if value == 0:
        raise ValueError("step must not be zero")
    if abs(value) > MAX_DP_SIZE:
        raise ValueError(f"step {value:+d} is beyond {MAX_DP_SIZE} either way")
    return value


def _intent_of(labels: dict[str, str], annotations: dict[str, str]) -> tuple[int | None, int | None] | str:
    """(target, step) from an alert's labels/annotations, or the reason it names neither validly."""

    def lookup(key: str) -> str | None:
        value = labels.get(key, annotations.get(key))
        return value.strip() if value is not None else None

    target_text = lookup(TARGET_KEY)
    if target_text is not None:
        if not _TARGET_RE.match(target_text) or not 1 <= int(target_text) <= MAX_DP_SIZE:
            return f"{TARGET_KEY} {target_text[:40]!r} is not a positive integer (at most {MAX_DP_SIZE})"
        return int(target_text), None
    step_text = lookup(STEP_KEY)
    scale_text = lookup(SCALE_KEY)
    direction: int | None = None
    if scale_text is not None:
        lowered = scale_text.lower()
        if lowered not in ("up", "down"):
            return f"{SCALE_KEY} {scale_text[:40]!r} is neither 'up' nor 'down'"
        direction = 1 if lowered == "up" else -1
    if step_text is not None:
        try:
            step = parse_step(step_text)
        except ValueError as exc:
            return str(exc)
        unsigned = not step_text.strip().startswith(("+", "-"))
        if direction is not None and unsigned:
            step = abs(step) * direction
        elif direction is not None and (step > 0) != (direction > 0):
            return f"{STEP_KEY} {step_text[:40]!r} contradicts {SCALE_KEY} {(scale_text or '')[:40]!r}"
        return None, step
    if direction is not None:
        return None, direction
    return f"alert names no {TARGET_KEY}, {STEP_KEY} or {SCALE_KEY}"


def plan(payload: AlertmanagerPayload) -> AlertmanagerPlan:
    """One ask per deployment the notification names (a firing intent, or a withdrawal when only
    resolved alerts name it), plus the alerts skipped and why."""
    result = AlertmanagerPlan(stream=intent_stream_key("alertmanager", payload.groupKey))
    firing: dict[str, list[tuple[AlertmanagerAlert, tuple[int | None, int | None]]]] = {}
    resolved: dict[str, list[AlertmanagerAlert]] = {}
    for alert in payload.alerts:
        labels = {**payload.commonLabels, **alert.labels}
        annotations = {**payload.commonAnnotations, **alert.annotations}
        deployment = labels.get(DEPLOYMENT_LABEL, "").strip() or None
        identity = (alert_identity(alert),)
        if deployment is not None and deployment not in result.named:
            if len(result.named) >= MAX_DEPLOYMENTS_PER_NOTIFICATION:
                result.beyond_cap[deployment] = result.beyond_cap.get(deployment, 0) + 1
                continue
            result.named.add(deployment)
        if alert.status != "firing":
            if deployment is None:
                result.skipped.append(
                    SkippedAlert(None, "alert resolved: it names no deployment", identity, True)
                )
            else:
                resolved.setdefault(deployment, []).append(alert)
            continue
        if deployment is None:
            result.skipped.append(SkippedAlert(None, f"alert has no {DEPLOYMENT_LABEL!r} label", identity))
            continue
        parsed = _intent_of(labels, annotations)
        if isinstance(parsed, str):
            result.skipped.append(SkippedAlert(deployment, parsed, identity))
            continue
        firing.setdefault(deployment, []).append((alert, parsed))

    for deployment in sorted(result.named):
        entries = firing.get(deployment, [])
        if not entries:
            alerts = resolved.get(deployment, [])
            if alerts:
                result.asks.append(
                    ScaleAsk(
                        deployment=deployment,
                        target_dp_size=None,
                        step=None,
                        reason=_reason(payload, alerts, "resolved"),
                        stream=result.stream,
                        identity=notification_identity(payload.groupKey, deployment, "resolved", alerts),
                        resolved=True,
                        fingerprints=_shown(alerts),
                    )
                )
            continue
        alerts = [alert for alert, _ in entries]
        wanted = {parsed for _, parsed in entries}
        if len(wanted) > 1:
            described = ", ".join(sorted(_describe(t, s) for t, s in wanted))
            result.skipped.append(
                SkippedAlert(deployment, f"firing alerts disagree on the scale ({described})", _shown(alerts))
            )
            continue
        target, step = wanted.pop()
        result.asks.append(
            ScaleAsk(
                deployment=deployment,
                target_dp_size=target,
                step=step,
                reason=_reason(payload, alerts, "firing"),
                stream=result.stream,
                identity=notification_identity(payload.groupKey, deployment, "firing", alerts),
                anchored=True,
                fingerprints=_shown(alerts),
            )
        )
    return result


def _reason(payload: AlertmanagerPayload, alerts: list[AlertmanagerAlert], status: str) -> str:
    names = sorted({a.labels.get("alertname", "") for a in alerts} - {""})
    what = ", ".join(names) or "alert"
    return f"alertmanager {payload.receiver or 'webhook'}: {what} {status}"


def _shown(alerts: list[AlertmanagerAlert]) -> tuple[str, ...]:
    return tuple(sorted(alert_identity(a) for a in alerts)[:MAX_FINGERPRINTS_SHOWN])


def _describe(target: int | None, step: int | None) -> str:
    return f"{TARGET_KEY}={target}" if target is not None else f"{STEP_KEY}={step:+d}"
