"""The canary probe on a reference-engine job, against fake agents whose `/v1/infer` is a small real
HTTP server (slow, failing) or nothing at all: the job records the client outage and the slowest
answer apart, names engines no canary could reach, and goes on as if the probe were not there."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy.engine import Engine as DbEngine
from sqlmodel import Session, select

from app.backends.reference.flow import Flow
from app.deployments.engines.models import Engine
from app.jobs.states import JobState
from app.probe.settings import ProbeSettings
from app.webhooks.models import OutboxEvent
from engine_agent import tensor_wire
from tests.runner.scenario import Scenario, make_scenario
from tests.support.processes import free_port


def serve_at(db_engine: DbEngine, scenario: Scenario, urls: list[str]) -> None:
    """The serving engines' rows point at `urls` (where the probe sends its canaries)."""
    with Session(db_engine) as session:
        for agent, url in zip(scenario.serving, urls, strict=True):
            row = session.get(Engine, agent.engine_id)
            assert row is not None
            row.url = url
            session.add(row)
        session.commit()


@pytest.fixture
def stage(db_engine: DbEngine) -> Scenario:
    """Two engines serving generation 1 at addresses where nothing listens, one idle engine."""
    scenario = make_scenario(db_engine)
    serve_at(db_engine, scenario, [f"http://127.0.0.1:{free_port()}" for _ in scenario.serving])
    return scenario


@contextlib.contextmanager
def infer_server(*, latency_s: float, status: int = 200) -> Iterator[str]:
    """A `/v1/infer` that answers every canary after `latency_s` with `status` (200: a token)."""
    body = tensor_wire.encode("float32", (1, 4), bytes(16)) if status == 200 else b"paused"

    class Infer(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            time.sleep(latency_s)
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Infer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def slow_stage(db_engine: DbEngine) -> Iterator[Scenario]:
    """Two serving engines that answer every canary, each in 150 ms (a busy host): slow, never failing.
    A launch of 0.3 s keeps a job to 4 running long enough for slow canaries to come back within it (a
    job of fake agents alone can end before the first one does)."""
    scenario = make_scenario(db_engine, launch_delay_s=0.3)
    with contextlib.ExitStack() as servers:
        urls = [servers.enter_context(infer_server(latency_s=0.15)) for _ in scenario.serving]
        serve_at(db_engine, scenario, urls)
        yield scenario


@pytest.fixture
def failing_stage(db_engine: DbEngine) -> Iterator[Scenario]:
    """Two serving engines that answer every canary at once with a 503."""
    scenario = make_scenario(db_engine)
    with contextlib.ExitStack() as servers:
        urls = [servers.enter_context(infer_server(latency_s=0.0, status=503)) for _ in scenario.serving]
        serve_at(db_engine, scenario, urls)
        yield scenario


def with_probe(stage: Scenario, settings: ProbeSettings) -> Scenario:
    launchers = {"local": stage.launcher}
    stage.flow = Flow(stage.record, stage.settings, launchers, "test", probe_settings=settings)
    return stage


def test_a_probe_that_cannot_reach_an_engine_names_it_and_the_job_succeeds(stage: Scenario) -> None:
    with_probe(stage, ProbeSettings(interval_s=0.01, baseline_s=0.05))
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    assert job.probe is not None and job.client_outage_ms is not None and job.client_outage_ms > 0
    assert job.client_slowest_answer_ms is None  # no canary answered
    serving = sorted(agent.engine_id for agent in stage.serving)
    assert sorted(job.probe["unreachable"]) == serving
    assert job.probe["canaries_sent"] > 0 and job.probe["canaries_failed"] == job.probe["canaries_sent"]
    assert {"before", "prepare", "sync", "pause", "switch"} <= set(job.probe["phases"])
    notes = [e for e in stage.events(job.id) if e.kind == "probe"]
    assert len(notes) == 1 and "could not reach" in (notes[0].message or "")


def test_a_failing_job_still_carries_the_probe(stage: Scenario) -> None:
    with_probe(stage, ProbeSettings(interval_s=0.01, baseline_s=0.0))
    stage.idle[0].faults.add("fail_prepare")
    job = stage.run_job(3)
    assert job.state == JobState.rolled_back
    assert job.probe is not None and "prepare" in job.probe["phases"]


def test_the_probe_switched_off_leaves_no_figures(stage: Scenario) -> None:
    with_probe(stage, ProbeSettings(enabled=False))
    job = stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    assert job.probe is None and job.client_outage_ms is None and job.client_slowest_answer_ms is None


def test_slow_canaries_that_never_fail_are_an_outage_no_longer_than_the_slowest_answer(
    slow_stage: Scenario,
) -> None:
    with_probe(slow_stage, ProbeSettings(interval_s=0.01, baseline_s=0.2, deadline_s=1.0))
    job = slow_stage.run_job(4)
    assert job.state == JobState.succeeded, job.error
    assert job.probe is not None and job.probe["canaries_failed"] == 0, job.probe
    # Every canary answered: a stretch with no answer lies within some canary's wait.
    assert job.client_slowest_answer_ms is not None and job.client_slowest_answer_ms >= 150.0
    assert job.client_outage_ms is not None and 0.0 < job.client_outage_ms <= job.client_slowest_answer_ms
    assert job.probe["slowest_answer_phase"] in job.probe["phases"]
    note = next(e for e in slow_stage.events(job.id) if e.kind == "probe")
    assert f"client outage {job.client_outage_ms:.1f} ms" in (note.message or "")
    assert "; slowest answer" in (note.message or "")
    with Session(slow_stage.db) as session:  # the webhook says it in the same words
        events = session.exec(select(OutboxEvent).where(OutboxEvent.job_id == job.id)).all()
    succeeded = next(e.payload["data"] for e in events if e.type == "reconfiguration.succeeded")
    assert succeeded["client_outage_ms"] == job.client_outage_ms
    assert succeeded["client_slowest_answer_ms"] == job.client_slowest_answer_ms


def test_failing_canaries_are_the_outage(failing_stage: Scenario) -> None:
    with_probe(failing_stage, ProbeSettings(interval_s=0.01, baseline_s=0.1))
    job = failing_stage.run_job(3)
    assert job.state == JobState.succeeded, job.error
    assert job.probe is not None and job.probe["failures"].get("503", 0) > 0, job.probe
    assert job.client_outage_ms is not None and job.client_outage_ms > 0.0
    assert job.probe["outage_phase"] in job.probe["phases"]
    assert job.probe["unreachable"] == {}  # they answered: a 503 is an answer
