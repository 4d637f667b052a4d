"""A real HAProxy for front-door tests (skipped with a reason where it is not installed), and tiny
HTTP servers that say who answered."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.frontdoor.haproxy import DoorConfig
from app.frontdoor.launch import RunningDoor, haproxy_binary, start_front_door
from tests.support.certs import ServerFiles
from tests.support.processes import free_port


def require_haproxy() -> None:
    if haproxy_binary() is None:
        pytest.skip(
            "haproxy is not installed (apt-get install haproxy; scripts/ensure-services does as root)"
        )


class NamedServer:
    """An HTTP server on 127.0.0.1 that answers every request with its name."""

    def __init__(self, name: str, tls: ServerFiles | None = None) -> None:
        """`tls`: served over HTTPS with this certificate and key (`https://127.0.0.1:port`)."""
        self.name = name

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                body = name.encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(tls.cert), str(tls.key))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def named_servers() -> Iterator[list[NamedServer]]:
    servers = [NamedServer(f"s{i}") for i in range(3)]
    yield servers
    for server in servers:
        server.close()


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[RunningDoor]:
    require_haproxy()
    door = start_front_door(tmp_path / "front-door", DoorConfig("fd", "127.0.0.1", free_port(), slots=4))
    yield door
    door.stop()
