"""A real HTTP webhook receiver on a free loopback port, scriptable per request.

`WebhookReceiver` verifies each request with the `standardwebhooks` package (the spec's own library),
answers from a script of responses (then 200), and, like a well-behaved receiver, processes each
`webhook-id` once: `processed` holds the payloads it acted on, `requests` every request it saw.
Reusable by other test modules (end-to-end tests can subscribe it to a coordinator).

It listens on loopback, where the coordinator delivers only when the operator allows it
(`EPCTL_WEBHOOK_ALLOW_NETWORKS`, app/core/targets.py): every test that delivers to it says so with
`ALLOW_LOOPBACK_ENV` (a coordinator process), `LOOPBACK` (a `DeliveryPolicy`) or `allowing_loopback`
(the app's settings).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.core.config import Settings
from app.core.targets import networks

LOOPBACK_NETWORKS = "127.0.0.0/8,::1/128"
LOOPBACK = networks(LOOPBACK_NETWORKS)
ALLOW_LOOPBACK_ENV = {"EPCTL_WEBHOOK_ALLOW_NETWORKS": LOOPBACK_NETWORKS}


def allowing_loopback(settings: Settings) -> Settings:
    """The coordinator's settings, delivering to this receiver on loopback too."""
    return settings.model_copy(update={"webhook_allow_networks": LOOPBACK_NETWORKS})


@dataclass
class ScriptedResponse:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None  # block the request until this is set (a hung receiver)
    body: bytes = b""  # what the receiver says besides its status


@dataclass
class ReceivedRequest:
    webhook_id: str
    headers: dict[str, str]
    body: bytes
    signature_valid: bool
    answered: int


class WebhookReceiver:
    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        self.script: list[ScriptedResponse] = []
        self.requests: list[ReceivedRequest] = []
        self.processed: dict[str, dict[str, Any]] = {}
        self.arrivals: list[str] = []  # webhook-ids as requests arrive, before any scripted hold
        self.arrived = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        host_text = host.decode() if isinstance(host, bytes) else host
        return f"http://{host_text}:{port}/hook"

    def respond(self, *responses: ScriptedResponse) -> None:
        with self.arrived:
            self.script.extend(responses)

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: predicate(self), timeout=timeout)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self.arrived:
            scripted = self.script.pop(0) if self.script else ScriptedResponse()
            self.arrivals.append(headers.get("webhook-id", ""))
            self.arrived.notify_all()
        if scripted.hold is not None:
            scripted.hold.wait(timeout=30)
        valid = False
        if self.secret is not None:
            try:
                Webhook(self.secret).verify(body, headers)
                valid = True
            except WebhookVerificationError:
                valid = False
        webhook_id = headers.get("webhook-id", "")
        status = scripted.status
        if self.secret is not None and not valid:
            status = 401
        # Recorded before the answer goes out: a sender that has its answer (a test that drained its
        # worker) then finds the request here. Recorded after it, this thread could still be on its way
        # to the list when the test read it (seen once: `[request] = receiver.requests` found none).
        with self.arrived:
            self.requests.append(ReceivedRequest(webhook_id, headers, body, valid, status))
            if 200 <= status < 300 and webhook_id not in self.processed:
                self.processed[webhook_id] = json.loads(body)
            self.arrived.notify_all()
        try:
            handler.send_response(status)
            for name, value in scripted.headers.items():
                handler.send_header(name, value)
            handler.send_header("content-length", str(len(scripted.body)))
            handler.end_headers()
            handler.wfile.write(scripted.body)
        except OSError:  # the sender gave up (killed, or timed out) while we held the request
            pass

    @contextmanager
    def running(self) -> Iterator[WebhookReceiver]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=5)
