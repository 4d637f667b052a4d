"""Which front doors this coordinator keeps: `EPCTL_FRONT_DOORS`, a JSON list (or `epctl up`, which
starts its own HAProxy and passes the same shape on `app.state.front_doors`).

    EPCTL_FRONT_DOORS='[{"deployment": "demo", "url": "http://127.0.0.1:8001",
                         "socket": "/var/run/haproxy/admin.sock"}]'
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from app.core.config import ConfigError
from app.frontdoor.haproxy import backend_name

ENV = "EPCTL_FRONT_DOORS"


class FrontDoorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment: str = Field(min_length=1, max_length=63, description="the deployment's name")
    url: str = Field(min_length=1, max_length=400, description="the front door's address, as clients use it")
    socket: str = Field(min_length=1, max_length=400, description="HAProxy's admin stats socket")
    backend: str | None = Field(None, description="the HAProxy backend (default ep_<deployment>)")
    request_log: str | None = Field(
        None,
        max_length=400,
        description="a Unix datagram socket the keeper binds and HAProxy logs each request to "
        "(`log <path> local0` and `requestlog.LOG_FORMAT`): jobs count the requests held in their window",
    )
    poll_s: float = Field(0.1, gt=0, le=10, description="how often the keeper re-reads the feed")
    tls_ca_file: str | None = Field(
        None,
        max_length=400,
        description="the CA bundle HAProxy's slots verify engines serving HTTPS with (the same path its "
        "configuration names: `haproxy.slot_options`); without it an https engine is kept out",
    )

    @property
    def backend_name(self) -> str:
        return self.backend or backend_name(self.deployment)


def load_front_doors(raw: str | None = None) -> list[FrontDoorSpec]:
    text = os.environ.get(ENV, "") if raw is None else raw
    if not text.strip():
        return []
    try:
        return TypeAdapter(list[FrontDoorSpec]).validate_json(text)
    except ValidationError as exc:
        raise ConfigError(f"{ENV}: {exc.errors(include_url=False)}") from None
