"""The test receiver itself (tests/operators/receiver.py): a request is on its record before its answer
goes out, so a test that has the answer (a drained delivery worker) reads it without waiting."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from tests.operators.receiver import WebhookReceiver


def test_a_request_is_recorded_before_it_is_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = WebhookReceiver()
    recorded_when_answered: list[int] = []
    send_response = BaseHTTPRequestHandler.send_response

    def spying(handler: BaseHTTPRequestHandler, code: int, message: str | None = None) -> None:
        recorded_when_answered.append(len(receiver.requests))
        send_response(handler, code, message)

    monkeypatch.setattr(BaseHTTPRequestHandler, "send_response", spying)
    with receiver.running():
        response = httpx.post(receiver.url, content=b"{}", headers={"webhook-id": "msg_1"}, timeout=10)
    assert response.status_code in (200, 401)
    assert recorded_when_answered == [1]
    assert [r.webhook_id for r in receiver.requests] == ["msg_1"]
