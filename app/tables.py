"""Every table module, imported so `SQLModel.metadata` is complete (Alembic and tests use it)."""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlmodel import SQLModel

import app.coordinators.models
import app.deployments.engines.models
import app.deployments.front_door
import app.deployments.incidents.models
import app.deployments.models
import app.frontdoor.models
import app.jobs.models
import app.scale.hooks.models
import app.scale.intents
import app.tokens.models
import app.webhooks.models  # noqa: F401


def metadata() -> MetaData:
    return SQLModel.metadata
