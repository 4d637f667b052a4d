"""Webhook targets are checked where it matters (issue 32): every spelling of an inside address refused
when a subscription is made or changed, a name that resolves inside refused at delivery (the connection
then goes to the address checked, the name in `Host`), unless the operator allows the network; and the
delivery log keeps a status and a short reason of ours, never the receiver's body.

In-process (the API over a real database, a real receiver on loopback); the DNS answers come from a
stand-in resolver where a test needs a name to resolve somewhere it chooses."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core import targets
from app.core.targets import TargetRefused, check_host, literal_address, networks, why_not
from app.webhooks import service
from app.webhooks.delivery import DeliveryPolicy, DeliveryWorker
from tests.operators import rows
from tests.operators.receiver import LOOPBACK, ScriptedResponse, WebhookReceiver
from tests.support.fixtures import token_headers

INSIDE = [
    "http://169.254.169.254/latest/meta-data/iam/",
    "http://[fd00:ec2::254]/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://10.0.0.1/",
    "http://[::1]:8000/",
    "http://0.0.0.0:8000/",
    "http://127.1:8000/",
    "http://2130706433:8000/",
    "http://0x7f000001:8000/",
    "http://0x7f.1:8000/",
    "http://0177.0.0.1:8000/",
    "http://127.0.0.1:5432/",
    "http://[::ffff:127.0.0.1]:8000/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[2002:7f00:1::]/",  # 6to4 around 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 around the metadata address
    "http://[fe80::1]/",
    "http://[::]/",
    "http://0/",
    "http://100.100.100.200/latest/meta-data/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://224.0.0.1/",
    "http://localhost:8000/",
    "http://api.localhost/",
    "http://LOCALHOST./",
]
PUBLIC = ["https://hooks.example/epctl", "http://8.8.8.8/hook", "http://[2606:4700:4700::1111]/hook"]


@pytest.fixture(autouse=True)
def _no_background_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("EPCTL_RUNNER_ENABLED", "false")
    monkeypatch.setenv("EPCTL_WEBHOOK_WORKER_ENABLED", "false")
    yield


def stand_in_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> None:
    """Names resolve to `answers` (a name not listed does not resolve)."""

    async def resolve(host: str, port: int) -> list[tuple[Any, ...]]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in answers[host]
        ]

    monkeypatch.setattr(targets, "resolver", resolve)


def test_every_spelling_of_an_inside_address_is_refused_at_subscription(client: TestClient) -> None:
    for url in INSIDE:
        created = client.post("/v1/webhooks", json={"url": url})
        assert created.status_code == 422, f"{url}: {created.text}"
        problem = created.json()
        # (A spelling the URL rule already refuses, such as 0177.0.0.1 for httpx, is a validation error.)
        assert problem["code"] in ("webhook-target-not-allowed", "validation-error"), (url, problem)
        if problem["code"] == "webhook-target-not-allowed":
            assert "public addresses" in problem["detail"], url
    assert client.get("/v1/webhooks").json()["count"] == 0  # nothing changed


def test_a_changed_url_is_checked_as_a_new_one(client: TestClient) -> None:
    created = client.post("/v1/webhooks", json={"url": PUBLIC[0]}).json()
    for url in INSIDE[:6]:
        answer = client.patch(f"/v1/webhooks/{created['id']}", json={"url": url})
        assert answer.status_code == 422 and answer.json()["code"] == "webhook-target-not-allowed", url
    assert client.get(f"/v1/webhooks/{created['id']}").json()["url"] == PUBLIC[0]


def test_public_targets_and_names_that_do_not_resolve_yet_are_taken(client: TestClient) -> None:
    for url in PUBLIC:
        assert client.post("/v1/webhooks", json={"url": url}).status_code == 201, url


def test_a_name_that_resolves_inside_is_refused_at_subscription(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_dns(monkeypatch, {"hooks.example": ["93.184.216.34", "10.1.2.3"]})  # one answer inside
    answer = client.post("/v1/webhooks", json={"url": "https://hooks.example/x"})
    assert answer.status_code == 422 and "10.1.2.3" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("host", "address"),
    [("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
     ("0177.0.0.1", "127.0.0.1"), ("[::ffff:127.0.0.1]", "::ffff:7f00:1"), ("10.0.0.1", "10.0.0.1"),
     ("example.com", None), ("1.2.3.4.5", None), ("0x", None)],
)  # fmt: skip
def test_every_literal_spelling_is_read_as_a_resolver_reads_it(host: str, address: str | None) -> None:
    found = literal_address(host)
    assert (str(found) if found else None) == address


def test_an_allowed_network_opens_exactly_that_network() -> None:
    allow = networks("127.0.0.0/8, ::1/128")
    assert check_host("http://127.0.0.1:8000/", allow) == "127.0.0.1"
    assert check_host("http://[::ffff:127.0.0.1]:8000/", allow)
    with pytest.raises(TargetRefused):
        check_host("http://169.254.169.254/", allow)
    assert why_not(ipaddress.ip_address("8.8.8.8")) is None
    with pytest.raises(ValueError, match="not a network"):
        networks("10.0.0.0/8,not-a-network")


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver().running() as receiver:
        yield receiver


def one_started_event(session: Session) -> None:
    job = rows.make_job(session, rows.make_deployment(session, "d1").id)
    rows.advance(session, job.id, rows.JobState.pending, rows.JobState.preparing)


def test_a_name_that_resolves_inside_at_delivery_is_refused_then(
    session: Session, db_engine: Engine, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: public when subscribed, loopback when delivered. Not sent; the record says why."""
    port = receiver.url.split(":")[2].split("/")[0]
    url = f"http://rebinding.example:{port}/hook"
    stand_in_dns(monkeypatch, {"rebinding.example": ["93.184.216.34"]})
    asyncio.run(targets.check_subscription_target(url, ()))  # public now: taken
    created = service.create_subscription(session, service.WebhookCreate(url=url))
    stand_in_dns(monkeypatch, {"rebinding.example": ["127.0.0.1"]})
    one_started_event(session)
    asyncio.run(DeliveryWorker(db_engine, DeliveryPolicy()).run_once())
    [delivery] = service.list_deliveries(session, created.id).data
    assert receiver.requests == []
    assert delivery.last_status_code is None and delivery.attempts[0].error is not None
    assert delivery.attempts[0].error.startswith(
        "not sent: the target rebinding.example (127.0.0.1) is a loopback"
    )


def test_a_delivery_goes_to_the_address_checked_with_the_name_as_host(
    session: Session, db_engine: Engine, receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pinned: the connection goes to the address that was checked (here an allowed loopback one), and
    the name travels in `Host`; the resolver is asked once per attempt."""
    port = receiver.url.split(":")[2].split("/")[0]
    stand_in_dns(monkeypatch, {"receiver.example": ["127.0.0.1"]})
    created = service.create_subscription(
        session, service.WebhookCreate(url=f"http://receiver.example:{port}/hook")
    )
    receiver.secret = created.secret
    one_started_event(session)
    asyncio.run(DeliveryWorker(db_engine, DeliveryPolicy(allow_networks=LOOPBACK)).run_once())
    [request] = receiver.requests
    assert request.signature_valid and request.headers["host"] == f"receiver.example:{port}"


def test_the_delivery_log_keeps_no_receiver_body_and_a_viewer_sees_a_masked_url(
    client: TestClient, session: Session, db_engine: Engine, receiver: WebhookReceiver
) -> None:
    created = service.create_subscription(session, service.WebhookCreate(url=receiver.url + "?token=s3cret"))
    receiver.secret = created.secret
    receiver.respond(ScriptedResponse(500, body=b"INTERNAL-ONLY: db password is hunter2"))
    one_started_event(session)
    asyncio.run(DeliveryWorker(db_engine, DeliveryPolicy(allow_networks=LOOPBACK)).run_once())
    viewer = token_headers(client, "viewer")
    log = client.get(f"/v1/webhooks/{created.id}/deliveries", headers=viewer)
    assert log.status_code == 200
    [delivery] = log.json()["data"]
    assert delivery["last_status_code"] == 500 and delivery["last_error"] == "HTTP 500"
    assert [a["error"] for a in delivery["attempts"]] == ["HTTP 500"]
    assert "hunter2" not in log.text and "INTERNAL" not in log.text
    shown = client.get(f"/v1/webhooks/{created.id}", headers=viewer).json()["url"]
    assert "s3cret" not in shown and "/hook" not in shown and shown.startswith("http://127.0.0.1:")
