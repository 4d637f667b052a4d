"""Alertmanager webhook bodies in the exact shape Alertmanager v0.27 sends (notify/webhook, version 4).

Reusable by the end-to-end tests: `firing_payload(deployment="d1", target_dp_size=4)` is what an
Alertmanager `webhook_config` POSTs to `/v1/hooks/alertmanager` when a scale alert fires, and
`scale_through_alertmanager(url, token, "d1", 4)` sends it to a running coordinator as Alertmanager
would (bearer token from `http_config.authorization`) and returns the job it created.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import httpx


def alert(
    *,
    deployment: str | None,
    status: str = "firing",
    alertname: str = "MoEQueueTooLong",
    starts_at: str = "2026-11-29T10:00:00.000Z",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    all_labels = {"alertname": alertname, "severity": "warning", **(labels or {})}
    if deployment is not None:
        all_labels["deployment"] = deployment
    fingerprint = hashlib.sha256(repr(sorted(all_labels.items())).encode()).hexdigest()[:16]
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": f"{alertname} on {deployment}", **(annotations or {})},
        "startsAt": starts_at,
        "endsAt": "2026-11-29T10:05:00.000Z" if status == "resolved" else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.local:9090/graph?g0.expr=queue_length+%3E+100&g0.tab=1",
        "fingerprint": fingerprint,
    }


def payload(
    alerts: list[dict[str, Any]], *, group_key: str = '{}:{alertname="MoEQueueTooLong"}'
) -> dict[str, Any]:
    statuses = {a["status"] for a in alerts}
    common = dict.fromkeys(alerts[0]["labels"]) if alerts else {}
    common_labels = {
        k: alerts[0]["labels"][k]
        for k in common
        if all(a["labels"].get(k) == alerts[0]["labels"][k] for a in alerts)
    }
    return {
        "receiver": "epctl",
        "status": "firing" if "firing" in statuses else "resolved",
        "alerts": alerts,
        "groupLabels": {"alertname": alerts[0]["labels"]["alertname"]} if alerts else {},
        "commonLabels": common_labels,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.local:9093",
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
    }


def firing_payload(
    deployment: str,
    *,
    target_dp_size: int | None = None,
    scale: str | None = None,
    step: str | None = None,
    starts_at: str = "2026-11-29T10:00:00.000Z",
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if target_dp_size is not None:
        labels["target_dp_size"] = str(target_dp_size)
    if scale is not None:
        labels["scale"] = scale
    if step is not None:
        labels["step"] = step
    return payload([alert(deployment=deployment, labels=labels, starts_at=starts_at)])


def resolved_payload(deployment: str, *, target_dp_size: int = 4) -> dict[str, Any]:
    return payload(
        [alert(deployment=deployment, status="resolved", labels={"target_dp_size": str(target_dp_size)})]
    )


def send_to_coordinator(
    base_url: str, token: str, body: dict[str, Any], *, timeout_s: float = 10.0
) -> httpx.Response:
    """POST a notification the way Alertmanager's webhook_config does (JSON, bearer credentials)."""
    return httpx.post(
        f"{base_url.rstrip('/')}/v1/hooks/alertmanager",
        json=body,
        headers={"Authorization": f"Bearer {token}", "User-Agent": "Alertmanager/0.27.0"},
        timeout=timeout_s,
    )


def scale_through_alertmanager(
    base_url: str, token: str, deployment: str, target_dp_size: int, *, starts_at: str | None = None
) -> str:
    """Fire a scale alert at a running coordinator; return the id of the job it created (or fail,
    showing the recorded reason). Each call is a new firing episode unless `starts_at` is given."""
    started = starts_at or datetime.now(UTC).isoformat().replace("+00:00", "Z")
    response = send_to_coordinator(
        base_url, token, firing_payload(deployment, target_dp_size=target_dp_size, starts_at=started)
    )
    assert response.status_code == 200, response.text
    [result] = response.json()["results"]
    assert result["decision"] == "accepted", result
    return str(result["job_id"])
