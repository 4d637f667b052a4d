"""Inference on the reference MoE engine (it stalls while the engine is paused, never fails by it).

The body is JSON (`{"tokens": [[...], ...]}`) or a binary tensor (`application/octet-stream`, see
`engine_agent.tensor_wire`); the answer takes the form asked (an `Accept` of one of the two wins, else
the request's own form). A binary answer carries the float32 outputs; generation, rank and step come
in `X-Epctl-*` headers. Every limit is checked before a tensor is made: a body past the largest
request is refused from its Content-Length (or while it streams in), a binary body's header is checked
against its length, dtype and hidden size before any data is read into a tensor.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from engine_agent import tensor_wire
from engine_agent.problems import ProblemError, problem_responses
from engine_agent.protocol import InferRequest, InferResponse
from engine_agent.routes.deps import AgentDep
from engine_agent.serving import EngineUnavailable

router = APIRouter(tags=["serving"])

MAX_REQUEST_TOKENS = 4096  # one request's tokens; a step takes up to 256 from the queue, or one bigger
JSON_BYTES_PER_VALUE = 32  # generous: a float in JSON with its separator
JSON_MEDIA_TYPE = "application/json"

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_WIRE_STATUS = {"invalid-tensor": 400, "unsupported-dtype": 422, "invalid-request": 422}

_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            JSON_MEDIA_TYPE: {"schema": InferRequest.model_json_schema()},
            tensor_wire.MEDIA_TYPE: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "b'EPT1', u8 dtype (1 float32, 2 float16, 3 bfloat16), u8 ndim (2), "
                    "u16 0, u32 x ndim shape [n, hidden_size], then the data, all little-endian",
                }
            },
        },
    }
}
_ANSWER_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the outputs, as JSON or as a float32 tensor body (the form asked)",
        "content": {
            JSON_MEDIA_TYPE: {"schema": InferResponse.model_json_schema()},
            tensor_wire.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


def _media(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def wants_binary(request: Request, binary_body: bool) -> bool:
    accept = request.headers.get("accept", "")
    if tensor_wire.MEDIA_TYPE in accept:
        return True
    if JSON_MEDIA_TYPE in accept:
        return False
    return binary_body


async def read_body(request: Request, limit: int) -> bytearray:
    """The body, refused (413) past `limit` bytes: from Content-Length before reading, else as it comes.
    Writable (torch shares it without a copy); with a Content-Length, read into one buffer of that
    size (each chunk copied once)."""
    declared = request.headers.get("content-length")
    expected = int(declared) if declared is not None and declared.isdigit() else None
    if expected is not None and expected > limit:
        raise ProblemError(413, "body-too-large", f"the body is larger than {limit} bytes")
    body = bytearray(expected or 0)
    size = 0
    try:
        async for chunk in request.stream():
            end = size + len(chunk)
            if end > limit:
                raise ProblemError(413, "body-too-large", f"the body is larger than {limit} bytes")
            if end <= len(body):
                body[size:end] = chunk
            else:  # no (or a wrong) Content-Length: grow as it comes
                body[size:] = chunk
            size = end
    except ClientDisconnect:
        # Nobody is left to answer; a problem (not an unhandled error's traceback) ends the request.
        raise ProblemError(
            400, "client-disconnected", "the client left before sending its whole body"
        ) from None
    if size < len(body):
        del body[size:]
    return body


def binary_tokens(body: bytearray, hidden: int) -> torch.Tensor:
    try:
        header = tensor_wire.parse_header(body, width=hidden, max_rows=MAX_REQUEST_TOKENS)
    except tensor_wire.WireError as exc:
        raise ProblemError(_WIRE_STATUS.get(exc.code, 400), exc.code, str(exc)) from exc
    # A view of the (writable) body: no copy here; the engine copies it to its device.
    return torch.frombuffer(body, dtype=_TORCH_DTYPES[header.dtype], offset=header.offset).view(header.shape)


def json_tokens(body: bytearray, hidden: int) -> torch.Tensor:
    try:
        parsed = InferRequest.model_validate_json(body)
    except ValidationError as exc:
        summary = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise ProblemError(422, "validation-error", summary or "the request is malformed") from exc
    if len(parsed.tokens) > MAX_REQUEST_TOKENS:
        raise ProblemError(422, "invalid-request", f"tokens per request must be 1..{MAX_REQUEST_TOKENS}")
    if any(len(row) != hidden for row in parsed.tokens):
        raise ProblemError(422, "invalid-request", f"every token needs {hidden} values")
    return torch.tensor(parsed.tokens, dtype=torch.float32)


@router.post(
    "/v1/infer",
    responses={**_ANSWER_DOC, **problem_responses(400, 413, 415, 422, 503)},
    openapi_extra=_BODY_DOC,
    response_class=Response,
)
async def infer(request: Request, agent: AgentDep) -> Response:
    hidden = agent.config.hidden_size
    media = _media(request.headers.get("content-type"))
    binary = media == tensor_wire.MEDIA_TYPE
    if not binary and media not in ("", JSON_MEDIA_TYPE):
        raise ProblemError(
            415, "unsupported-media-type", f"send {JSON_MEDIA_TYPE} or {tensor_wire.MEDIA_TYPE}, not {media}"
        )
    if binary:
        limit = 16 + MAX_REQUEST_TOKENS * hidden * 4
    else:
        limit = 64 + MAX_REQUEST_TOKENS * hidden * JSON_BYTES_PER_VALUE
    body = await read_body(request, limit)
    tokens = binary_tokens(body, hidden) if binary else json_tokens(body, hidden)
    try:
        future = agent.engine.submit(tokens)
        result = await asyncio.wrap_future(future)
    except EngineUnavailable as exc:
        raise ProblemError(503, "unavailable", str(exc)) from exc
    if wants_binary(request, binary):
        outputs = result.outputs.contiguous()
        # The header and the outputs' own memory joined: one copy of the data, not two.
        data = tensor_wire.encode("float32", tuple(outputs.shape), outputs.numpy().data.cast("B"))
        headers = {
            "X-Epctl-Generation": str(result.generation),
            "X-Epctl-Rank": str(result.rank),
            "X-Epctl-Step": str(result.step),
        }
        return Response(data, media_type=tensor_wire.MEDIA_TYPE, headers=headers)
    answer = InferResponse(
        outputs=result.outputs.tolist(), generation=result.generation, rank=result.rank, step=result.step
    )
    return Response(answer.model_dump_json(), media_type=JSON_MEDIA_TYPE)
