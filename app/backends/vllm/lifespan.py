"""The vLLM backend's part of the coordinator's life: its settings and the local vLLM launcher. Its
servers outlive the coordinator (serving never depends on it): what a predecessor left running is
adopted at start, and nothing is stopped at shutdown (`epctl down` stops them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI

from app.backends.vllm.launcher import VllmLauncher
from app.backends.vllm.settings import load_vllm_settings

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def vllm_backend(app: FastAPI) -> AsyncIterator[VllmLauncher]:
    settings = load_vllm_settings()  # ConfigError here stops start-up with its message
    launcher = VllmLauncher(
        Path(app.state.settings.data_dir),
        python=settings.vllm_python(),
        ready_timeout_s=settings.ready_timeout_s,
        stop_grace_s=settings.stop_grace_s,
    )
    kept = await asyncio.to_thread(launcher.adopt_all)
    if kept:
        log.warning("adopted the vLLM servers a previous coordinator left running: %s", ", ".join(kept))
    app.state.vllm_settings = settings
    app.state.vllm_launcher = launcher
    yield launcher
