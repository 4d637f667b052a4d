"""The vLLM backend's knobs (`EPCTL_VLLM_*`). Bad values stop start-up with one clear message."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.core.config import ConfigError

REPO_VLLM_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"


class VllmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EPCTL_VLLM_", extra="ignore", env_ignore_empty=True)

    call_timeout_s: float = Field(5.0, gt=0, description="one health / metrics / is-scaling call")
    preflight_deadline_s: float = Field(30.0, gt=0, description="health, not scaling, DP size, a canary")
    baseline_s: float = Field(1.0, ge=0, description="canaries before the scale call (the baseline)")
    scale_deadline_s: float = Field(
        900.0, gt=0, description="the blocking /scale_elastic_ep call's timeout (the committing phase)"
    )
    verify_deadline_s: float = Field(60.0, gt=0, description="after a 200: not scaling, size, a canary")
    settle_s: float = Field(
        5.0, ge=0, description="after a failure: how long the engine may still say it is scaling"
    )
    accept_check_timeout_s: float = Field(
        5.0, gt=0, description="after a failure: a no-op scale to the current size must answer in this"
    )
    canary_interval_s: float = Field(0.1, gt=0, description="one canary completion per this, per server")
    canary_timeout_s: float = Field(5.0, gt=0, description="a canary unanswered this long failed")
    canary_deadline_s: float = Field(
        1.0, gt=0, description="a canary answered later than this counts toward the outage, like a 503"
    )
    canary_prompt: str = Field("Hello", min_length=1)
    python: str = Field(
        "", description="local launcher: the interpreter with vLLM (default: .venv-vllm, else this one)"
    )
    ready_timeout_s: float = Field(300.0, gt=0, description="local launcher: server start to ready")
    stop_grace_s: float = Field(10.0, gt=0, description="local launcher: SIGTERM to SIGKILL")

    def vllm_python(self) -> str:
        if self.python:
            return self.python
        if REPO_VLLM_PYTHON.exists():
            return str(REPO_VLLM_PYTHON)
        return sys.executable


def load_vllm_settings() -> VllmSettings:
    try:
        return VllmSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"EPCTL_VLLM_{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None
