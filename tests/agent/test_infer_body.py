"""How `/v1/infer` reads its body (`engine_agent.routes.infer.read_body`), in-process: into one writable
buffer of the declared size (each chunk copied once, the tensor a view of it, no further copy), or
grown as it comes without a Content-Length; refused past its limit either way."""

from __future__ import annotations

import asyncio

import pytest
import torch
from starlette.requests import Request

from engine_agent import tensor_wire
from engine_agent.problems import ProblemError
from engine_agent.routes.infer import binary_tokens, read_body


def request_of(chunks: list[bytes], declared: int | None) -> Request:
    headers = [(b"content-length", str(declared).encode())] if declared is not None else []
    last = len(chunks) - 1
    messages = [{"type": "http.request", "body": c, "more_body": i < last} for i, c in enumerate(chunks)]

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    return Request({"type": "http", "method": "POST", "path": "/v1/infer", "headers": headers}, receive)


def body_of(tokens: torch.Tensor) -> bytes:
    return tensor_wire.encode("float32", tuple(tokens.shape), tokens.numpy().tobytes())


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "no-length"])
def test_the_body_is_read_whole_into_a_writable_buffer_the_tensor_shares(declared: bool) -> None:
    tokens = torch.randn(5, 8)
    body = body_of(tokens)
    chunks = [body[i : i + 37] for i in range(0, len(body), 37)]
    read = asyncio.run(read_body(request_of(chunks, len(body) if declared else None), limit=1 << 20))
    assert isinstance(read, bytearray) and bytes(read) == body
    shared = binary_tokens(read, hidden=8)
    assert torch.equal(shared, tokens)
    read[-4:] = b"\0\0\0\0"  # the tensor is a view of the buffer: no copy was made
    assert float(shared[-1, -1]) == 0.0


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "no-length"])
def test_a_body_past_the_limit_is_refused(declared: bool) -> None:
    chunks = [b"x" * 64] * 3
    with pytest.raises(ProblemError) as refused:
        asyncio.run(read_body(request_of(chunks, 192 if declared else None), limit=100))
    assert refused.value.status == 413
