"""`/v1/infer` with a binary tensor body: the same outputs as JSON, the answer in the form asked, and a
malformed body refused as problem+json before anything big is allocated."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from engine_agent import moe, tensor_wire
from tests.agent.driver import REL_TOL, SMALL, AgentProcess, Driver, random_tokens, start_agents, stop_agents

pytestmark = pytest.mark.processes

PROBLEM = "application/problem+json"
BINARY = {"content-type": tensor_wire.MEDIA_TYPE}


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[AgentProcess]]:
    """Two agents serving one generation (every step crosses both)."""
    agents = start_agents(2, Path(tmp_path_factory.mktemp("binary")))
    try:
        Driver().reconfigure(agents)
        yield agents
    finally:
        stop_agents(agents)


def body_of(tokens: torch.Tensor, dtype: str = "float32") -> bytes:
    cast = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    raw = tokens.to(cast).contiguous().view(torch.uint8).numpy().tobytes()
    return tensor_wire.encode(dtype, tuple(tokens.shape), raw)


def tensor_of(response: httpx.Response) -> torch.Tensor:
    header, data = tensor_wire.decode(response.content)
    assert header.dtype == "float32"
    return torch.frombuffer(bytearray(data), dtype=torch.float32).view(header.shape)


def peak_rss_bytes(agent: AgentProcess) -> int:
    for line in Path(f"/proc/{agent.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def post_declaring(url: str, sent: bytes, *, content_length: int) -> tuple[int, str]:
    """A POST whose Content-Length claims more than is sent (httpx refuses to send one)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(
            f"POST /v1/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: {tensor_wire.MEDIA_TYPE}\r\n"
            f"Content-Length: {content_length}\r\n\r\n".encode()
            + sent
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.decode(errors="replace").partition("\r\n")
    return int(status_line.split()[1]), rest


def test_binary_and_json_give_identical_outputs(serving: list[AgentProcess]) -> None:
    agent = serving[0]
    tokens = random_tokens(SMALL, 5)
    as_json = agent.client.post("/v1/infer", json={"tokens": tokens.tolist()})
    as_binary = agent.client.post("/v1/infer", content=body_of(tokens), headers=BINARY)
    assert as_json.status_code == 200 and as_binary.status_code == 200
    assert as_binary.headers["content-type"] == tensor_wire.MEDIA_TYPE
    assert int(as_binary.headers["x-epctl-generation"]) == as_json.json()["generation"]
    got = tensor_of(as_binary)
    assert torch.equal(got, torch.tensor(as_json.json()["outputs"], dtype=torch.float32))
    reference = moe.reference_forward(SMALL, tokens)
    assert float((got - reference).norm() / reference.norm()) < REL_TOL


def test_the_answer_takes_the_form_asked(serving: list[AgentProcess]) -> None:
    agent = serving[1]
    tokens = random_tokens(SMALL, 2)
    json_answer = agent.client.post(
        "/v1/infer", content=body_of(tokens), headers={**BINARY, "accept": "application/json"}
    )
    assert json_answer.status_code == 200 and json_answer.headers["content-type"] == "application/json"
    binary_answer = agent.client.post(
        "/v1/infer", json={"tokens": tokens.tolist()}, headers={"accept": tensor_wire.MEDIA_TYPE}
    )
    assert binary_answer.headers["content-type"] == tensor_wire.MEDIA_TYPE
    assert torch.equal(tensor_of(binary_answer), torch.tensor(json_answer.json()["outputs"]))


def test_half_precision_tokens_are_served(serving: list[AgentProcess]) -> None:
    tokens = random_tokens(SMALL, 3).to(torch.bfloat16)
    answer = serving[0].client.post("/v1/infer", content=body_of(tokens, "bfloat16"), headers=BINARY)
    assert answer.status_code == 200
    reference = moe.reference_forward(SMALL, tokens.float())
    assert float((tensor_of(answer) - reference).norm() / reference.norm()) < REL_TOL


def header(code: int, rows: int, cols: int, ndim: int = 2) -> bytes:
    return struct.pack("<4sBBH", b"EPT1", code, ndim, 0) + b"".join(
        struct.pack("<I", d) for d in (rows, cols)[:ndim]
    )


MALFORMED = [
    "short-data",
    "long-data",
    "bad-dtype",
    "wrong-hidden",
    "no-rows",
    "one-dim",
    "short-header",
    "magic",
]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (header(1, 4, SMALL.hidden_size) + b"\0" * 12, 400, "invalid-tensor"),  # short data
        (header(1, 1, SMALL.hidden_size) + b"\0" * (4 * SMALL.hidden_size + 4), 400, "invalid-tensor"),
        (header(9, 1, SMALL.hidden_size) + b"\0" * (4 * SMALL.hidden_size), 422, "unsupported-dtype"),
        (header(1, 1, SMALL.hidden_size + 1) + b"\0" * (4 * SMALL.hidden_size + 4), 422, "invalid-request"),
        (header(1, 0, SMALL.hidden_size), 422, "invalid-request"),  # no tokens
        (header(1, 1, SMALL.hidden_size, ndim=1), 400, "invalid-tensor"),
        (b"EPT", 400, "invalid-tensor"),  # shorter than the header
        (b"NOPE" + header(1, 1, SMALL.hidden_size)[4:], 400, "invalid-tensor"),
    ],
    ids=MALFORMED,
)
def test_a_malformed_binary_body_is_a_problem(
    serving: list[AgentProcess], body: bytes, status: int, code: str
) -> None:
    answer = serving[0].client.post("/v1/infer", content=body, headers=BINARY)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM and answer.json()["code"] == code


def test_a_huge_declared_shape_allocates_nothing_big(serving: list[AgentProcess]) -> None:
    """4 G rows x hidden floats declared (tens of GiB if anything trusted it), a few bytes sent; then a
    Content-Length past the largest request: both refused, and the agent's peak memory did not move."""
    agent = serving[0]
    before = peak_rss_bytes(agent)
    huge = agent.client.post("/v1/infer", content=header(1, 2**32 - 1, SMALL.hidden_size), headers=BINARY)
    assert huge.status_code == 422 and huge.json()["code"] == "invalid-request"
    status, text = post_declaring(agent.url, header(1, 1, SMALL.hidden_size), content_length=2**40)
    assert status == 413 and "body-too-large" in text
    assert peak_rss_bytes(agent) - before < 64 * 2**20


def test_an_unknown_media_type_is_refused(serving: list[AgentProcess]) -> None:
    answer = serving[0].client.post("/v1/infer", content=b"tokens", headers={"content-type": "text/plain"})
    assert answer.status_code == 415 and answer.json()["code"] == "unsupported-media-type"
