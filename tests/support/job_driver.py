"""The CLI and dashboard tests' coordinator (the harness's, on a fresh SQLite file) and the helpers that
drive its jobs through the state machine against the same file, as the runner would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import Coordinator


@contextmanager
def run_coordinator(tmp_dir: Path, **env: str) -> Iterator[Coordinator]:
    """A coordinator on a fresh SQLite file in `tmp_dir`, ready; always stopped afterwards."""
    with Coordinator(f"sqlite:///{tmp_dir / 'coordinator.db'}", tmp_dir, env=env) as coordinator:
        yield coordinator


def create_static_deployment(
    api: httpx.Client, name: str, engines: int, *, serving: int = 2, max_dp_size: int = 8
) -> Any:
    """A `static` deployment with `engines` registered agents, the first `serving` of them in
    generation 1 (their URLs lead nowhere: tests that use it drive jobs through the state machine)."""
    response = api.post(
        "/v1/deployments",
        json={"name": name, "launcher": "static", "min_dp_size": 1, "max_dp_size": max_dp_size},
    )
    response.raise_for_status()
    for index in range(engines):
        in_group = index < serving
        registration: dict[str, Any] = {
            "engine_id": f"{name}-e{index}",
            "deployment": name,
            "url": f"http://127.0.0.1:9/{name}-e{index}",
            "platform": "cpu",
            "device": "cpu",
            "engine": {},
            "generation": 1 if in_group else 0,
            "rank": index if in_group else None,
        }
        api.post("/v1/engines", json=registration).raise_for_status()
    return response.json()


# --- driving a job through the state machine, as the runner would ------------------------------------


def _pause(engine_index: int, commit_at: float, pause_ms: float) -> dict[str, Any]:
    paused_at = commit_at + engine_index * 0.0005
    return {
        "paused_at": paused_at,
        "resumed_at": paused_at + pause_ms / 1000.0,
        "pause_ms": pause_ms,
        "boundary_wait_ms": 0.2,
        "warmup_ms": 0.0,
        "blocking_prepare_ms": 0.0,
        "switch_ms": 1.0,
        "resume_ms": 0.1,
    }


def engine_results(
    engine_ids: list[str],
    *,
    from_size: int,
    to_size: int,
    generation: int,
    pauses: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    results = []
    for index, engine_id in enumerate(engine_ids):
        role = (
            "staying"
            if index < min(from_size, to_size)
            else ("joining" if to_size > from_size else "leaving")
        )
        results.append(
            {
                "engine_id": engine_id,
                "role": role,
                "old_rank": index if index < from_size else None,
                "new_rank": index if index < to_size else None,
                "phase": "committed" if pauses else "prepared",
                "generation": generation,
                "pause": (pauses or {}).get(engine_id),
                "error": None,
            }
        )
    return results


class JobDriver:
    """Moves one job along with A's `transition` / `append_event`, against the coordinator's own DB."""

    def __init__(self, database_url: str, job_id: str) -> None:
        from app.core.db import make_engine

        self.engine = make_engine(database_url)
        self.job_id = job_id

    def job(self) -> Any:
        from sqlmodel import Session

        from app.jobs.models import ReconfigurationJob

        with Session(self.engine) as session:
            row = session.get(ReconfigurationJob, self.job_id)
            assert row is not None
            session.expunge(row)
            return row

    def move(self, from_state: str, to_state: str, message: str | None = None, **changes: Any) -> None:
        from sqlmodel import Session

        from app.jobs.models import JobError
        from app.jobs.states import JobState
        from app.jobs.transitions import transition

        if isinstance(changes.get("error"), dict):  # a test's error as JSON: the record takes the model
            changes["error"] = JobError.model_validate(changes["error"])
        with Session(self.engine) as session:
            transition(
                session,
                job_id=self.job_id,
                from_state=JobState(from_state),
                to_state=JobState(to_state),
                message=message,
                changes=changes or None,
            )

    def progress(self, step: str, percent: float, **changes: Any) -> None:
        from sqlmodel import Session

        from app.jobs.transitions import append_event

        with Session(self.engine) as session:
            append_event(
                session,
                job_id=self.job_id,
                kind="progress",
                message=step,
                data={"step": step, "percent": percent},
                changes={"progress_step": step, "progress_percent": percent, **changes},
            )

    def close(self) -> None:
        self.engine.dispose()


def drive_to_success(
    driver: JobDriver, engine_ids: list[str], *, pause_ms: float = 12.5, step_delay_s: float = 0.0
) -> None:
    """pending -> preparing -> syncing -> committing -> cleaning_up -> succeeded, with progress,
    per-engine pauses and the downtime they make."""
    job = driver.job()
    from_size, to_size, generation = job.from_dp_size, job.to_dp_size, job.to_generation
    participants = engine_ids[: max(from_size, to_size)]

    def beat() -> None:
        if step_delay_s:
            time.sleep(step_delay_s)

    driver.move(
        "pending",
        "preparing",
        "claimed by the test driver",
        warmup_policy="eager",
        progress_step="preparing",
        progress_percent=5.0,
    )
    beat()
    driver.progress(
        "preparing: transfer weights",
        30.0,
        engine_results=engine_results(
            participants, from_size=from_size, to_size=to_size, generation=generation
        ),
    )
    beat()
    driver.move(
        "preparing", "syncing", "every engine prepared", progress_step="syncing", progress_percent=60.0
    )
    beat()
    driver.move("syncing", "committing", "synced", progress_step="committing", progress_percent=75.0)
    beat()
    commit_at = time.time()
    pauses = {engine_id: _pause(i, commit_at, pause_ms - i * 0.5) for i, engine_id in enumerate(participants)}
    window_end = max(p["resumed_at"] for p in pauses.values())
    downtime = {
        "downtime_ms": round((window_end - commit_at) * 1000.0, 3),
        "window_start": commit_at,
        "window_end": window_end,
        "per_engine_ms": {k: v["pause_ms"] for k, v in pauses.items()},
    }
    driver.move(
        "committing",
        "cleaning_up",
        "switched",
        progress_step="cleaning_up",
        progress_percent=90.0,
        downtime_ms=downtime["downtime_ms"],
        downtime=downtime,
        engine_results=engine_results(
            participants, from_size=from_size, to_size=to_size, generation=generation, pauses=pauses
        ),
        cleanup_state="running",
    )
    beat()
    driver.move(
        "cleaning_up",
        "succeeded",
        "old groups destroyed",
        progress_step="done",
        progress_percent=100.0,
        cleanup_state="succeeded",
    )


def drive_to_rollback(driver: JobDriver, *, engine_id: str, message: str = "connection refused") -> None:
    """pending -> preparing -> rolled_back: an agent failed during prepare (downtime 0)."""
    driver.move(
        "pending",
        "preparing",
        "claimed by the test driver",
        warmup_policy="eager",
        progress_step="preparing",
        progress_percent=5.0,
    )
    driver.move(
        "preparing",
        "rolled_back",
        f"prepare failed on {engine_id}",
        downtime_ms=0.0,
        downtime={"downtime_ms": 0.0, "per_engine_ms": {}},
        error={"phase": "preparing", "engine_id": engine_id, "type": "agent-unreachable", "message": message},
    )
