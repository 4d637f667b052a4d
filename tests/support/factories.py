"""Rows for tests, made through the real services (so they obey the same rules as the API)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine as SqlEngine
from sqlmodel import Session

from app.deployments.engines.models import Engine
from app.deployments.engines.service import register_engine
from app.deployments.models import Deployment, DeploymentCreate, LauncherKind
from app.deployments.service import create_deployment
from app.jobs.models import ReconfigurationCreate, ReconfigurationJob, RequestSource
from app.jobs.service import create_reconfiguration
from engine_agent.protocol import AgentRegistration, EngineConfig, Platform


def make_deployment(session: Session, name: str = "demo", **fields: Any) -> Deployment:
    fields.setdefault("min_dp_size", 1)
    fields.setdefault("max_dp_size", 8)
    return create_deployment(session, data=DeploymentCreate(name=name, **fields))


def register_engines(
    session: Session,
    deployment: Deployment,
    count: int,
    *,
    platform: Platform = Platform.cpu,
    first_index: int = 0,
) -> list[Engine]:
    engines = []
    for index in range(first_index, first_index + count):
        registration = AgentRegistration(
            engine_id=f"{deployment.name}-engine-{index}",
            deployment=deployment.name,
            url=f"http://127.0.0.1:{9000 + index}",
            platform=platform,
            device=platform.value,
            engine=EngineConfig.model_validate(deployment.engine_config),
        )
        engines.append(register_engine(session, registration=registration)[0])
    return engines


def make_job(
    session: Session,
    deployment: Deployment,
    target_dp_size: int,
    *,
    source: RequestSource = RequestSource.api,
    requester: str | None = "test",
    **fields: Any,
) -> ReconfigurationJob:
    request = ReconfigurationCreate(deployment=deployment.name, target_dp_size=target_dp_size, **fields)
    return create_reconfiguration(session, request=request, requested_by=source, requester=requester).job


def static_deployment(
    session: Session, name: str = "static-demo", engines: int = 2, **fields: Any
) -> Deployment:
    deployment = make_deployment(session, name, launcher=LauncherKind.static, **fields)
    register_engines(session, deployment, engines)
    return deployment


def set_row(db_engine: SqlEngine, model: type[Any], key: str, **fields: Any) -> None:
    """Write `fields` straight onto one row (a state the services would reach by a longer way)."""
    with Session(db_engine) as session:
        row = session.get(model, key)
        assert row is not None, (model.__name__, key)
        for name, value in fields.items():
            setattr(row, name, value)
        session.add(row)
        session.commit()
