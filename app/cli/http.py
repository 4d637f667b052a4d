"""The CLI's HTTP/1.1 client, on the standard library.

`epctl` is a short-lived process: importing httpx and building its client (an SSL context loading the
CA bundle) cost ~0.25 s of CPU before the first byte, more than the rest of a `jobs list`. This client
does what the CLI needs and no more: JSON requests, query strings, a timeout, and one streamed body
read line by line (the job's event stream). One connection per request (a CLI call makes a few);
HTTPS with the system's CA store (`SSL_CERT_FILE` / `SSL_CERT_DIR` honoured by Python's `ssl`); no
proxy support.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class TransportError(Exception):
    """No answer: the coordinator could not be reached, or the connection broke."""


class StreamInterrupted(TransportError):
    """A streamed body went quiet past its read timeout, or the connection dropped mid-stream."""


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    content: bytes = b""

    @property
    def is_error(self) -> bool:
        return self.status >= 400

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass
class StreamingResponse:
    status: int
    reason: str
    _raw: http.client.HTTPResponse

    @property
    def is_error(self) -> bool:
        return self.status >= 400

    def read(self) -> Response:
        """The rest of the body, as a whole response."""
        return Response(self.status, self.reason, _headers(self._raw), self._raw.read())

    def iter_lines(self) -> Iterator[str]:
        """Decoded lines without their line ending, until the body ends."""
        try:
            while line := self._raw.readline():
                yield line.decode("utf-8", errors="replace").rstrip("\r\n")
        except TimeoutError as exc:
            raise StreamInterrupted("no data within the read timeout") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise StreamInterrupted(f"{exc.__class__.__name__}: {exc}") from exc


def _headers(raw: http.client.HTTPResponse) -> dict[str, str]:
    return {name.lower(): value for name, value in raw.getheaders()}


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class HttpClient:
    def __init__(self, base_url: str, *, headers: Mapping[str, str], timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"{base_url!r} is not an http:// or https:// URL")
        self.base_url = base_url
        self.headers = dict(headers)
        self.timeout_s = timeout_s
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._https:
            import ssl  # only for https: creating its context costs CPU a plain-http call need not pay

            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout_s, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)

    def _target(self, path: str, params: Mapping[str, Any] | None) -> str:
        target = self._prefix + path
        if params:
            target += "?" + urllib.parse.urlencode({k: _query_value(v) for k, v in params.items()})
        return target

    def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        timeout_s: float,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        all_headers = {**self.headers, **(headers or {})}
        body: bytes | None = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            all_headers["Content-Type"] = "application/json"
        connection = self._connection(timeout_s)
        try:
            connection.request(method, self._target(path, params), body=body, headers=all_headers)
            return connection, connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise TransportError(f"{exc.__class__.__name__}: {exc}") from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        connection, raw = self._send(
            method, path, json_body=json_body, params=params, headers=headers, timeout_s=self.timeout_s
        )
        try:
            return Response(raw.status, raw.reason, _headers(raw), raw.read())
        except (OSError, http.client.HTTPException) as exc:
            raise TransportError(f"{exc.__class__.__name__}: {exc}") from exc
        finally:
            connection.close()

    @contextmanager
    def stream(
        self, method: str, path: str, *, headers: Mapping[str, str] | None = None, read_timeout_s: float
    ) -> Iterator[StreamingResponse]:
        """A response whose body is read as it comes; a read quiet for `read_timeout_s` raises
        `StreamInterrupted` (the same bound applies to connecting)."""
        connection, raw = self._send(
            method, path, json_body=None, params=None, headers=headers, timeout_s=read_timeout_s
        )
        try:
            yield StreamingResponse(raw.status, raw.reason, raw)
        finally:
            raw.close()
            connection.close()
