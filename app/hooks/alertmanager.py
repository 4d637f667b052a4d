"""Prometheus Alertmanager webhook (payload version 4) -> scale intents.

Alertmanager sends one notification per alert group; it repeats it every `repeat_interval` while the
group fires, re-sends it when an alert joins or leaves the group, and retries any 5xx. So this module
turns a payload into at most one intent per deployment, each with a dedupe key built from the group
key and the group's firing episode (the earliest `startsAt` among the group's alerts for that
deployment): a repeat, or a second per-instance alert joining a firing group, dedupes; a new episode
after the group resolved does not. Alerts that cannot be acted on are returned with the reason (and
whether they were merely resolved), never raised.

Labels and annotations an alert uses (alert-level values override the common ones); the README's
"Alertmanager" section lists them too:
- `deployment` (label, required): the deployment to scale;
- `target_dp_size` (label or annotation): an absolute target, 1..1024;
- or `step` (`+1`, `-2`, `2`) and/or `scale` (`up` | `down`): relative to the size the deployment is
  heading to (an active job's target, else the current size); `scale` alone is a step of 1.
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


@dataclass(frozen=True)
class ScaleIntent:
    """What a request asks for: an absolute target or a signed step, for one deployment."""

    deployment: str
    target_dp_size: int | None
    step: int | None
    reason: str
    dedupe_key: str | None = None

    def describe(self) -> str:
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
    intents: list[ScaleIntent] = field(default_factory=list)
    skipped: list[SkippedAlert] = field(default_factory=list)


def alert_identity(alert: AlertmanagerAlert) -> str:
    """`fingerprint@startsAt`; Alertmanager always sends a fingerprint, but compute one if absent."""
    fingerprint = (
        alert.fingerprint or hashlib.sha256(repr(sorted(alert.labels.items())).encode()).hexdigest()[:16]
    )
    started = alert.startsAt.isoformat() if alert.startsAt else ""
    return f"{fingerprint}@{started}"


def dedupe_key(group_key: str, deployment: str, alerts: list[AlertmanagerAlert]) -> str:
    """One key per group and firing episode: the episode starts at the group's earliest `startsAt`."""
    starts = sorted(a.startsAt.isoformat() for a in alerts if a.startsAt is not None)
    episode = starts[0] if starts else "\n".join(sorted(alert_identity(a) for a in alerts))
    material = "\n".join([group_key, deployment, episode])
    return "am:" + hashlib.sha256(material.encode()).hexdigest()


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
    """Group firing alerts by deployment and turn each group into one intent (or a skip with reason)."""
    result = AlertmanagerPlan()
    by_deployment: dict[str, list[tuple[AlertmanagerAlert, tuple[int | None, int | None]]]] = {}
    for alert in payload.alerts:
        labels = {**payload.commonLabels, **alert.labels}
        annotations = {**payload.commonAnnotations, **alert.annotations}
        deployment = labels.get(DEPLOYMENT_LABEL, "").strip() or None
        identity = (alert_identity(alert),)
        if alert.status != "firing":
            result.skipped.append(
                SkippedAlert(
                    deployment, "alert resolved: resolved alerts never scale", identity, resolved=True
                )
            )
            continue
        if deployment is None:
            result.skipped.append(SkippedAlert(None, f"alert has no {DEPLOYMENT_LABEL!r} label", identity))
            continue
        parsed = _intent_of(labels, annotations)
        if isinstance(parsed, str):
            result.skipped.append(SkippedAlert(deployment, parsed, identity))
            continue
        by_deployment.setdefault(deployment, []).append((alert, parsed))

    for deployment, entries in by_deployment.items():
        alerts = [alert for alert, _ in entries]
        # The episode counts every alert of the group naming the deployment, resolved ones included.
        episode = [
            a
            for a in payload.alerts
            if {**payload.commonLabels, **a.labels}.get(DEPLOYMENT_LABEL, "").strip() == deployment
        ]
        wanted = {parsed for _, parsed in entries}
        identities = tuple(sorted(alert_identity(a) for a in alerts))
        if len(wanted) > 1:
            described = ", ".join(sorted(_describe(t, s) for t, s in wanted))
            result.skipped.append(
                SkippedAlert(deployment, f"firing alerts disagree on the scale ({described})", identities)
            )
            continue
        target, step = wanted.pop()
        names = sorted({a.labels.get("alertname", "") for a in alerts} - {""})
        reason = f"alertmanager {payload.receiver or 'webhook'}: " + (", ".join(names) or "firing alert")
        result.intents.append(
            ScaleIntent(
                deployment=deployment,
                target_dp_size=target,
                step=step,
                reason=reason,
                dedupe_key=dedupe_key(payload.groupKey, deployment, episode),
            )
        )
    return result


def _describe(target: int | None, step: int | None) -> str:
    return f"{TARGET_KEY}={target}" if target is not None else f"{STEP_KEY}={step:+d}"
