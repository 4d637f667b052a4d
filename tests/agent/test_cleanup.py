"""The cleanup worker: retired groups destroyed in the background; a failure is kept, announced once,
and resolved only by retry or acknowledge."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine_agent.protocol import CleanupRecord, CleanupState
from engine_agent.reconfig.cleanup import CleanupWorker, RetiredGeneration


class FakeGroup:
    def __init__(self) -> None:
        self.destroyed = 0


@pytest.fixture
def destroyed() -> list[object]:
    return []


@pytest.fixture
def announced() -> list[CleanupRecord]:
    return []


@pytest.fixture
def worker(destroyed: list[object], announced: list[CleanupRecord]) -> Iterator[CleanupWorker]:
    w = CleanupWorker(destroy=destroyed.append, on_failure=announced.append)
    yield w
    w.stop()


def retired(generation: int) -> RetiredGeneration:
    return RetiredGeneration(job_id=f"job-{generation}", generation=generation, groups=[FakeGroup()])  # type: ignore[list-item]


def test_a_retired_generation_is_destroyed_in_the_background(
    worker: CleanupWorker, destroyed: list[object]
) -> None:
    item = retired(1)
    worker.submit(item)
    assert worker.wait_idle(5)
    assert destroyed == item.groups
    status = worker.status()
    assert status.state == CleanupState.idle and status.failure is None
    assert status.recent[0].ok and status.recent[0].generation == 1


def test_a_failure_is_kept_and_announced_once(
    worker: CleanupWorker, destroyed: list[object], announced: list[CleanupRecord]
) -> None:
    worker.fail_next()
    worker.submit(retired(2))
    assert worker.wait_idle(5)
    for _ in range(3):
        status = worker.status()
        assert status.state == CleanupState.failed
        assert (
            status.failure is not None and status.failure.job_id == "job-2" and status.failure.generation == 2
        )
    assert worker.unresolved_failure() is not None
    assert len(announced) == 1
    assert destroyed == []


def test_retry_destroys_the_failed_generation_and_clears_the_failure(
    worker: CleanupWorker, destroyed: list[object], announced: list[CleanupRecord]
) -> None:
    worker.fail_next()
    item = retired(3)
    worker.submit(item)
    assert worker.wait_idle(5)
    assert worker.retry()
    assert worker.wait_idle(5)
    assert destroyed == item.groups
    status = worker.status()
    assert status.state == CleanupState.idle and status.failure is None
    assert [r.ok for r in status.recent] == [True, False]
    assert len(announced) == 1


def test_acknowledge_clears_the_failure_without_destroying(
    worker: CleanupWorker, destroyed: list[object]
) -> None:
    worker.fail_next()
    worker.submit(retired(4))
    assert worker.wait_idle(5)
    record = worker.acknowledge()
    assert record is not None and record.generation == 4
    assert worker.status().state == CleanupState.idle
    assert worker.acknowledge() is None and not worker.retry()
    assert destroyed == []


class FakeGraphs:
    graph_bytes = 4096

    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


def test_retired_graphs_are_released_in_the_background_and_their_memory_recorded(
    worker: CleanupWorker,
) -> None:
    graphs = FakeGraphs()
    worker.submit(RetiredGeneration(job_id="job-3", generation=3, graphs=[graphs]))
    assert worker.wait_idle(5)
    assert graphs.released == 1
    record = worker.status().recent[0]
    assert record.ok and record.graph_bytes_released == 4096


def test_a_retry_after_a_failed_group_destroy_releases_the_graphs_once(
    destroyed: list[object], announced: list[CleanupRecord]
) -> None:
    failures = iter([RuntimeError("destroy failed"), None])

    def destroy(group: object) -> None:
        error = next(failures)
        if error is not None:
            raise error

    worker = CleanupWorker(destroy=destroy, on_failure=announced.append)
    try:
        graphs = FakeGraphs()
        worker.submit(RetiredGeneration(job_id="job-4", generation=4, groups=[FakeGroup()], graphs=[graphs]))  # type: ignore[list-item]
        assert worker.wait_idle(5) and worker.status().state == CleanupState.failed
        assert graphs.released == 0  # the groups first: nothing of a failed cleanup is half-released
        assert worker.retry() and worker.wait_idle(5)
        assert graphs.released == 1 and worker.status().recent[0].graph_bytes_released == 4096
    finally:
        worker.stop()
