"""Errors on the Kubernetes paths (`/api`, `/apis/...`) as `v1` `Status` objects, so kubectl shows them
(`Error from server (Conflict): the scale of deployment "demo" has been modified ...`) and client-go
classifies them (`IsConflict`, `IsNotFound`). Everywhere else errors stay problem+json.

An ASGI middleware rather than per-route handlers: an error may come from anywhere before the route
(authentication, the request limits, an unknown path under `/apis`), and each is rewritten the same way,
from the problem's `status`, `detail` and `code`.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.scale.kube.objects import status_object
from engine_agent.problems import PROBLEM_MEDIA_TYPE


def kubernetes_path(path: str) -> bool:
    return path in ("/api", "/apis") or path.startswith(("/api/", "/apis/"))


def _name_from(path: str) -> str | None:
    parts = path.strip("/").split("/")
    if "deployments" in parts:
        index = parts.index("deployments")
        if index + 1 < len(parts):
            return parts[index + 1]
    return None


def as_status(body: bytes, status: int, path: str) -> bytes:
    """The problem+json `body` as a `Status`; a body that is not a problem keeps only its status code."""
    try:
        problem: Any = json.loads(body)
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    message = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
    code = problem.get("code")
    document = status_object(
        status, message, code=code if isinstance(code, str) else None, name=_name_from(path)
    )
    return json.dumps(document).encode()


class KubernetesStatusErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not kubernetes_path(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                sent = {k.lower(): v for k, v in message.get("headers", [])}
                media = sent.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1")
                if message["status"] >= 400 and media == PROBLEM_MEDIA_TYPE:
                    start = message  # held until the body is complete
                    return
                await send(message)
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = as_status(b"".join(chunks), start["status"], scope.get("path", ""))
            kept = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-type", b"content-length")
            ]
            headers = [
                *kept,
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, rewrite)
