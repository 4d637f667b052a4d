"""The steady heartbeat's statements (issue 37): the write that renews an engine's record, and what it reads
back (the engine's row, its deployment's name and keys), built once: building one costs more than
running it. `service.record_steady_heartbeat` runs the write with its read-back (RETURNING) for one
heartbeat; `batch.record_batch` runs the write for a whole batch at once (one `executemany`) and reads
the rows written back in one SELECT."""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa

from app.deployments.engines.models import Engine, EngineState
from app.deployments.models import Deployment


@functools.cache
def steady_update() -> sa.Update:
    """The steady heartbeat's write, nothing read back (the batch runs it for many: `batch.record_batch`)."""
    engines = Engine.__table__  # type: ignore[attr-defined]
    renewed = (
        "state",
        "generation",
        "dp_rank",
        "world_size",
        "group_steps",
        "last_heartbeat_at",
        "updated_at",
    )
    cleared = ("broken_generation", "unresponsive_peers", "broken_reported_at", "broken_last_step_at")
    return (
        sa.update(engines)
        .where(
            engines.c.id == sa.bindparam("engine_id"),
            engines.c.state != EngineState.left.value,
            # A fenced engine takes the whole path (`stays_fenced`).
            engines.c.state != EngineState.fenced.value,
            engines.c.link_lost_at.is_(None),
        )
        .values(
            **{name: sa.bindparam(f"new_{name}", type_=engines.c[name].type) for name in renewed},
            **{name: None for name in (*cleared, "data_unreachable")},
        )
    )


def steady_columns() -> list[Any]:
    """What a steady heartbeat reads back: its engine's row, its deployment's name and keys."""
    engines, deployments = Engine.__table__, Deployment.__table__  # type: ignore[attr-defined]

    def of_deployment(column: sa.Column[Any], label: str) -> Any:
        return (
            sa.select(column)
            .where(deployments.c.id == engines.c.deployment_id)
            .scalar_subquery()
            .label(label)
        )

    return [
        *engines.c,
        of_deployment(deployments.c.name, "deployment"),
        of_deployment(deployments.c.agent_key, "agent_key"),
        of_deployment(deployments.c.agent_key_previous, "agent_key_previous"),
        of_deployment(deployments.c.agent_key_previous_until, "agent_key_previous_until"),
    ]


@functools.cache
def steady_statement() -> sa.Update:
    """`record_steady_heartbeat`'s statement, built once (building it costs more than running it)."""
    return steady_update().returning(*steady_columns())


@functools.cache
def steady_read() -> sa.Select[Any]:
    """The rows a batch's `steady_update` just wrote (`ids`, written at `at`: an engine the write's
    conditions left alone keeps its older time), with what `steady_statement` returns."""
    engines = Engine.__table__  # type: ignore[attr-defined]
    return sa.select(*steady_columns()).where(
        engines.c.id.in_(sa.bindparam("ids", expanding=True)),
        engines.c.last_heartbeat_at == sa.bindparam("at", type_=engines.c.last_heartbeat_at.type),
    )
