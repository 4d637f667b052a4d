"""The operators' surfaces together, against a real coordinator process: an Alertmanager notification
creates a job, its progress streams over SSE, and a subscribed receiver gets every event signed.
(The runner is off: the test moves the job with the state machine, as a runner would.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.jobs.states import JobState
from tests.operators import rows, sse
from tests.operators.alertmanager_payloads import scale_through_alertmanager
from tests.operators.receiver import ALLOW_LOOPBACK_ENV, WebhookReceiver
from tests.support.processes import Coordinator


@pytest.mark.processes
def test_alertmanager_scale_streams_progress_and_notifies_subscribers(
    database_url: str, tmp_path: Path, db_engine: Engine
) -> None:
    env = {
        "EPCTL_EVENTS_POLL_S": "0.05",
        "EPCTL_WEBHOOK_POLL_S": "0.05",
        "EPCTL_AUTO_MIGRATE": "false",
        **ALLOW_LOOPBACK_ENV,  # the receiver listens on loopback
    }
    with (
        WebhookReceiver().running() as receiver,
        Coordinator(database_url, tmp_path / "data", env=env) as live,
        live.client() as admin,
    ):
        admin.post(
            "/v1/deployments", json={"name": "d1", "launcher": "static", "max_dp_size": 4}
        ).raise_for_status()
        for index in range(4):
            engine = {
                "engine_id": f"e{index}",
                "deployment": "d1",
                "url": f"http://127.0.0.1:9/{index}",
                "platform": "cpu",
                "device": "cpu",
                "engine": {},
            }
            admin.post("/v1/engines", json=engine).raise_for_status()
        subscription = admin.post("/v1/webhooks", json={"url": receiver.url}).json()
        receiver.secret = subscription["secret"]
        token = admin.post("/v1/tokens", json={"name": "alertmanager", "role": "autoscaler"}).json()["token"]

        job_id = scale_through_alertmanager(live.url, token, "d1", 3)
        assert admin.get(f"/v1/reconfigurations/{job_id}").json()["requested_by"] == "autoscaler"

        with Session(db_engine) as session:
            rows.run_to_success(session, job_id)
        stream = admin.get(f"/v1/reconfigurations/{job_id}/events")
        received = list(sse.events(iter(stream.text.splitlines())))
        assert [e.data["to_state"] for e in received if e.event == "transition"][-1] == JobState.succeeded
        assert received[-1].event == "end"

        assert receiver.wait_for(lambda r: len(r.processed) == 5, timeout=20), live.log_tail()
    types = sorted(body["type"] for body in receiver.processed.values())
    assert types.count("reconfiguration.phase_changed") == 3
    assert {"reconfiguration.started", "reconfiguration.succeeded"} <= set(types)
    assert all(r.signature_valid for r in receiver.requests)
