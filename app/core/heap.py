"""The coordinator's start-up heap kept out of the garbage collector's full passes (issue 37).

A started coordinator holds a few hundred thousand long-lived objects (its modules, FastAPI's and
SQLAlchemy's structures, pydantic's schemas). Python's full (generation 2) collection walks all of them
each time the objects allocated since the last one reach a quarter of that count: under 700 heartbeats a
second that came every few seconds and cost ~0.1 s of CPU each, a fifth of a heartbeat's CPU in
`benchmarks/heartbeat_profile.py`. `gc.freeze()` once the coordinator has started moves them to the
permanent generation, which no collection walks; what is allocated later is collected as before. A
start-up object that becomes garbage later is freed by its reference count as ever; only one caught in
a reference cycle would wait for `gc.unfreeze()` (at the stop).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """What exists now (its garbage collected first) out of the collector's passes until the end."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
