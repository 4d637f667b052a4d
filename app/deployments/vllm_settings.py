"""A `vllm` deployment's settings as the API takes and shows them (the backend that drives it is
`app.backends.vllm`).

A vLLM deployment is one vLLM API server (elastic EP runs behind a single API server) that scales its
own data-parallel size through `POST /scale_elastic_ep`. The API key is write-only: stored with the
deployment, sent on every call to the server, never shown (`api_key_set` says whether there is one).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SecretStr, field_validator
from pydantic import Field as ApiField

from app.core.urls import checked_http_url

URL_PATTERN = r"^https?://[^\s/]+(:\d+)?(/[^\s]*)?$"
# vLLM's route wants a positive integer (a float is a 400), two minutes by default.
DEFAULT_DRAIN_TIMEOUT_S = 120


def _normalize_url(url: str | None) -> str | None:
    return checked_http_url(url).rstrip("/") if url else url


class VllmConfig(BaseModel):
    """What `POST /v1/deployments` takes under `vllm` (with `"backend": "vllm"`)."""

    url: str | None = ApiField(
        None,
        pattern=URL_PATTERN,
        max_length=512,
        description="the vLLM API server, e.g. http://10.0.0.5:8000; required unless launcher is local "
        "(which sets it when it starts the server)",
    )
    api_key: SecretStr | None = ApiField(
        None, max_length=512, description="sent as `Authorization: Bearer` on every call; never shown"
    )
    drain_timeout_s: int = ApiField(
        DEFAULT_DRAIN_TIMEOUT_S,
        ge=1,
        le=86400,
        description="passed to vLLM as `drain_timeout`: how long it waits for running requests to drain",
    )
    model: str | None = ApiField(
        None, max_length=1024, description="local launcher: the model (directory or name) vLLM serves"
    )
    served_model_name: str | None = ApiField(
        None, max_length=256, description="the model name canaries ask for; default: the server's first"
    )
    serve_args: list[str] = ApiField(
        default_factory=list,
        max_length=64,
        description="local launcher: extra server flags, e.g. on GPU hosts `--enable-elastic-ep "
        "--enable-expert-parallel --enable-eplb --data-parallel-backend ray`",
    )
    cpu_defaults: bool = ApiField(
        True,
        description="local launcher: add the flags and environment of vLLM's CPU build (laptops, CI); "
        "false on GPU hosts",
    )

    @field_validator("url")
    @classmethod
    def _no_trailing_slash(cls, url: str | None) -> str | None:
        return _normalize_url(url)

    def stored(self) -> dict[str, Any]:
        """The JSON kept in the deployment row (the key is kept apart, in its secret column)."""
        return self.model_dump(mode="json", exclude={"api_key"})


class VllmUpdate(BaseModel):
    """`PATCH /v1/deployments/{name}` under `vllm`: only the fields given change. An empty `api_key`
    removes the key."""

    url: str | None = ApiField(None, pattern=URL_PATTERN, max_length=512)
    api_key: SecretStr | None = ApiField(None, max_length=512)
    drain_timeout_s: int | None = ApiField(None, ge=1, le=86400)
    served_model_name: str | None = ApiField(None, max_length=256)
    serve_args: list[str] | None = ApiField(None, max_length=64)
    cpu_defaults: bool | None = None

    @field_validator("url")
    @classmethod
    def _no_trailing_slash(cls, url: str | None) -> str | None:
        return _normalize_url(url)


class VllmPublic(BaseModel):
    url: str | None
    api_key_set: bool
    drain_timeout_s: int
    model: str | None
    served_model_name: str | None
    serve_args: list[str]
    cpu_defaults: bool

    @classmethod
    def from_stored(cls, stored: dict[str, Any] | None, *, api_key_set: bool) -> VllmPublic:
        config = VllmConfig.model_validate(stored or {})
        return cls(**config.model_dump(exclude={"api_key"}), api_key_set=api_key_set)
