"""Building one NIXL agent with a UCX backend, whether that works here at all, and the engine's standing
agent (`nixl_standing`).

NIXL's Python wrapper offers no option for the progress thread's delay, so `new_nixl_agent` hands the
wrapper a stand-in for its binding module while the agent is built (`_ProgressDelayBindings`), which
sets it. NIXL's own exceptions become `TransferError` (`nixl_errors`). `new_lease` is an agent as a
channel uses it: with a scrap of the device's memory registered before anyone takes its metadata."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from engine_agent.transfer.base import TransferError

logger = logging.getLogger(__name__)


def normalize_ucx_environment() -> None:
    # An empty UCX_TLS makes the UCX backend fail to start: empty means "not set", so treat it so.
    if os.environ.get("UCX_TLS", None) == "":
        logger.warning("UCX_TLS is set but empty; unsetting it so UCX picks its default transports")
        del os.environ["UCX_TLS"]


# Microseconds the NIXL progress thread sleeps between rounds. nixl 1.5.1's Python wrapper hard-codes
# 0, which keeps the thread spinning: measured here, an idle agent burnt 30-60% of a core (2% at
# 10 us), taking CPU from the serving loop that runs beside prepare, and reads were no faster for it.
NIXL_PROGRESS_DELAY_US = 10
_agent_creation = threading.Lock()


class _ProgressDelayBindings:
    """Stands in for nixl's binding module while one agent is built, to set the progress delay the
    wrapper offers no option for."""

    def __init__(self, bindings: Any) -> None:
        self._bindings = bindings

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # the binding's own name
        with contextlib.suppress(AttributeError, TypeError):
            config.pthrDelay = NIXL_PROGRESS_DELAY_US
        return self._bindings.nixlAgent(name, config)


def default_read_threads() -> int:
    """Reader threads (one UCX worker each) per NIXL channel: EPCTL_NIXL_READ_THREADS, else one per
    core up to 8. On one host UCX moves host memory with a single-threaded process_vm_readv per
    worker (about 4 GiB/s each, measured); 8 workers reached 20 GiB/s on a 16-core host."""
    configured = os.environ.get("EPCTL_NIXL_READ_THREADS", "").strip()
    if configured:
        return max(1, int(configured))
    return max(1, min(8, os.cpu_count() or 1))


def new_nixl_agent(name: str, workers: int = 1) -> Any:
    normalize_ucx_environment()
    from nixl import _api as nixl_api

    with _agent_creation:
        bindings = nixl_api.nixlBind
        nixl_api.nixlBind = _ProgressDelayBindings(bindings)
        try:
            # RW: reader threads post and poll concurrently; registration stays exclusive.
            config = nixl_api.nixl_agent_config(
                backends=[], sync_mode=nixl_api.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
            )
            agent = nixl_api.nixl_agent(name, config)
        finally:
            nixl_api.nixlBind = bindings
    if "UCX" not in agent.get_plugin_list():
        raise TransferError("NIXL has no UCX plugin")
    agent.create_backend("UCX", {"num_workers": str(workers)})
    return agent


@contextlib.contextmanager
def nixl_errors(what: str) -> Iterator[None]:
    """NIXL raises its own exception types; callers of the channel see TransferError."""
    try:
        yield
    except TransferError:
        raise
    except Exception as error:
        raise TransferError(f"{what}: {type(error).__name__}: {error}") from error


@dataclass
class AgentLease:
    """A NIXL agent as a channel uses it, with the scrap of device memory registered on it for its life:
    UCX sets up the transports for a memory type on its first registration, which changes the
    connection info, and a peer that loaded the old info then refuses the new (NIXL_ERR_NOT_ALLOWED),
    so the scrap is registered before anyone takes the agent's metadata. `standing`: lent by the
    engine's standing agent (`nixl_standing`), to be given back at the channel's close."""

    agent: Any
    name: str
    workers: int
    device_type: str
    scrap: torch.Tensor
    scrap_registration: Any
    standing: bool = False


def new_lease(name: str, workers: int, device: torch.device) -> AgentLease:
    agent = new_nixl_agent(name, workers)
    scrap = torch.empty(4096, dtype=torch.uint8, device=device)
    registration = agent.register_memory([scrap])
    return AgentLease(agent, name, workers, device.type, scrap, registration)


def drop_lease(lease: AgentLease) -> None:
    """Deregister the scrap and let the agent go (its destructor holds the GIL ~0.1 s here)."""
    with contextlib.suppress(Exception):
        lease.agent.deregister_memory(lease.scrap_registration)
    lease.agent = None


_probe_lock = threading.Lock()
_probed: list[str | None] = []  # the probe's answer, once known (one per process)


def probe_nixl(keep: Callable[[AgentLease], bool] | None = None) -> str | None:
    """None when NIXL with a UCX agent works in this process, else why not (probed once per process).
    `keep`: when this call is the one that probes, it is offered the probe's agent (as a lease with
    `default_read_threads()` UCX workers and a CPU scrap) and returns whether it keeps it."""
    with _probe_lock:
        if _probed:
            return _probed[0]
        workers = default_read_threads() if keep is not None else 1
        try:
            name = f"{'probe' if keep is None else 'standing'}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
            lease = new_lease(name, workers, torch.device("cpu"))
        except ImportError as error:
            _probed.append(f"nixl is not installed: {error}")
        except Exception as error:
            _probed.append(f"a NIXL UCX agent cannot be created: {error}")
        else:
            _probed.append(None)
            if keep is None or not keep(lease):
                drop_lease(lease)
        return _probed[0]


def nixl_unavailable_reason() -> str | None:
    """None when NIXL with a UCX agent works in this process, else why not (cached per process)."""
    return probe_nixl()
