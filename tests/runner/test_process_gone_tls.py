"""The liveness pass's "is its process gone?" probe (`app.backends.reference.liveness.probes`): an
engine whose certificate fails verification is listening (not gone: the heartbeat timeout decides);
nothing listening is gone."""

from __future__ import annotations

import asyncio
import http.server
import ssl
import threading
from pathlib import Path

from app.backends.reference.liveness.probes import process_gone
from tests.support.certs import TestCA
from tests.support.processes import free_port


def test_a_listener_whose_certificate_fails_verification_is_not_a_gone_process(tmp_path: Path) -> None:
    files = TestCA(tmp_path, "not-the-operators").server("engine")
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert asyncio.run(process_gone(f"https://127.0.0.1:{server.server_address[1]}")) is False
        assert asyncio.run(process_gone(f"https://127.0.0.1:{free_port()}")) is True
    finally:
        server.shutdown()
        server.server_close()
