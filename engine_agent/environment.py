"""What an engine process starts with: an allow-list of environment variables, never a copy of the
launcher's whole environment (which holds the coordinator's own secrets: `EPCTL_ADMIN_TOKEN`, the
sealing key `EPCTL_SECRET_KEY`, `DATABASE_URL` with its password). Any code that runs inside an engine
(a backend, a model's code) can read its environment; it gets only what an engine needs:

- the platform: `CUDA_*`, `NCCL_*`, `UCX_*`, `GLOO_*`, `NIXL_*`, ROCm's (`HIP_*`, `ROCR_*`, `HSA_*`),
  `NVIDIA_*`, the thread pools' (`OMP_*`, `MKL_*`, `KMP_*`, `OPENBLAS_*`), torch's (`TORCH_*`,
  `PYTORCH_*`), `TRITON_*`;
- the basics: `PATH`, `HOME`, `USER`, `TMPDIR`, locale (`LANG`, `LC_*`), `TZ`, `PYTHONPATH` and
  Python's own switches, `VIRTUAL_ENV`, `LD_LIBRARY_PATH`, the TLS trust store (`SSL_CERT_FILE`,
  `SSL_CERT_DIR`);
- the agent's own settings (`EPCTL_AGENT_*`, `EPCTL_NIXL_*`, `EPCTL_LOG_FORMAT`), and what the launcher
  gives it by name (its bearer token, its keys and their end), never inherited;
- names an operator adds (`extra_names`, e.g. Ray's `runtime_env.env_vars`, the vLLM server's `HF_*`).

The coordinator's own secrets are refused even when listed (`NEVER`). Standard library only: the Ray
actor that hosts an agent imports this.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

BASIC_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "HOSTNAME", "TMPDIR", "TMP", "TEMP", "TZ", "LANG",
        "LANGUAGE", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER", "PYTHONWARNINGS", "PYTHONHASHSEED", "PYTHONIOENCODING", "VIRTUAL_ENV",
        "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
        "EPCTL_LOG_FORMAT",
    }
)  # fmt: skip
PLATFORM_PREFIXES = (
    "LC_", "CUDA_", "NCCL_", "UCX_", "GLOO_", "NIXL_", "NVIDIA_", "HIP_", "ROCM_", "ROCR_", "HSA_",
    "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH_", "PYTORCH_", "TRITON_", "EPCTL_AGENT_", "EPCTL_NIXL_",
)  # fmt: skip
# Given by the launcher by name (from its spec), never inherited; or the coordinator's own secrets.
LAUNCHER_GIVES = frozenset(
    {"EPCTL_TOKEN", "EPCTL_AGENT_KEY", "EPCTL_AGENT_KEY_PREVIOUS", "EPCTL_AGENT_KEY_PREVIOUS_UNTIL"}
)
NEVER = frozenset(
    {
        "EPCTL_ADMIN_TOKEN", "EPCTL_SECRET_KEY", "DATABASE_URL", "EPCTL_DATABASE_URL",
        "EPCTL_HOOKS_INBOUND_SECRET", "EPCTL_HOOKS_INBOUND_SECRETS", "EPCTL_TLS_KEY_FILE",
        "VLLM_API_KEY", *LAUNCHER_GIVES,
    }
)  # fmt: skip


def allowed(name: str, extra_names: Iterable[str] = (), extra_prefixes: Iterable[str] = ()) -> bool:
    """Whether an engine inherits the variable `name` (see the module doc)."""
    if name in NEVER:
        return False
    return (
        name in BASIC_NAMES
        or name.startswith((*PLATFORM_PREFIXES, *extra_prefixes))
        or name in set(extra_names)
    )


def engine_environment(
    source: Mapping[str, str],
    given: Mapping[str, str | None] | None = None,
    *,
    extra_names: Iterable[str] = (),
    extra_prefixes: Iterable[str] = (),
) -> dict[str, str]:
    """The environment an engine starts with: what `source` (the launcher's) holds of the allow-list,
    then `given` (set by name; None values are left out)."""
    names, prefixes = tuple(extra_names), tuple(extra_prefixes)
    env = {name: value for name, value in source.items() if allowed(name, names, prefixes)}
    env.update({name: value for name, value in (given or {}).items() if value is not None})
    return env
