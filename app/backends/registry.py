"""The built-in backends, one per `EngineBackend`: what the runner drives jobs through and the
deployments API tells of a deployment's creation and deletion. A third backend is one more entry here."""

from __future__ import annotations

from app.backends.base import BackendContext, Backends
from app.backends.reference.backend import ReferenceBackend
from app.backends.vllm.backend import VllmBackend
from app.backends.vllm.launcher import VllmLauncher


def builtin_backends(context: BackendContext, *, vllm_launcher: VllmLauncher | None = None) -> Backends:
    """`vllm_launcher`: the local vLLM launcher, where this coordinator runs one
    (`app.backends.vllm.lifespan`)."""
    return Backends(context.db, [ReferenceBackend(context), VllmBackend(context, vllm_launcher)])
