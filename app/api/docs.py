"""`/docs`: Swagger UI from local assets (`engine_agent.docs`, shared with the agent), never a CDN."""

from __future__ import annotations

from engine_agent.docs import CSP as CSP
from engine_agent.docs import SECURITY_HEADERS as SECURITY_HEADERS
from engine_agent.docs import docs_router

router = docs_router("epctl coordinator - API")
