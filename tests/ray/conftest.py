"""A real local Ray cluster for the Ray launcher's tests, started and stopped by each test module that
uses it (only `test_ray_launcher.py` does): a session-wide cluster idled on through every test after
tests/ray/ (its GCS, raylets, dashboard and agents on the same 2 cores) until the session's end.

Two Ray nodes on this machine (`ray.cluster_utils.Cluster`: a head and a second node joined to it, each
its own raylet), both on 127.0.0.1 with a fixed CPU count, with their own temporary directory, so
nothing here touches another Ray on the machine. Only the processes this fixture started are stopped
at the end (never `ray stop`, which stops every Ray process on the machine). The test process is a Ray
driver too: it reads Ray's own view (actors, nodes) to check where the engines run.

Every test here is skipped, with the reason, when Ray is not installed (`pip install '.[ray]'`): test
modules import it through `import_ray()`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import free_port

CPUS_PER_NODE = 2
# Keep every Ray port on loopback (PLATFORM.md): for the nodes and every driver (this process and the
# coordinators it starts). Ray reads it when first imported, so it is set before any test imports Ray.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
os.environ.update(LOOPBACK_ENV)
RAY_MISSING = "Ray is not installed: pip install '.[ray]' (ray[default]==2.60.0)"


def import_ray() -> Any:
    """`ray`, or skip the calling test module (with the reason) when it is not installed."""
    return pytest.importorskip("ray", reason=RAY_MISSING)


@dataclass
class RayCluster:
    address: str  # the GCS, host:port, as deployments name it
    head_node_id: str
    worker_node_id: str
    cluster: Any  # ray.cluster_utils.Cluster

    def node_ids(self) -> set[str]:
        return {self.head_node_id, self.worker_node_id}

    def actors(self, namespace: str) -> list[Any]:
        """Ray's own list of the actors in `namespace` (alive and dead)."""
        from ray.util.state import list_actors

        return list(list_actors(filters=[("ray_namespace", "=", namespace)], limit=1000, detail=True))

    def alive_actors(self, namespace: str) -> dict[str, Any]:
        return {a.name: a for a in self.actors(namespace) if a.state == "ALIVE"}

    def kill_namespace(self, namespace: str) -> None:
        """Stop every engine actor a test left in its namespace (no deployment leaks into the next)."""
        import ray

        for name in self.alive_actors(namespace):
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    import ray
    from ray.cluster_utils import Cluster

    saved = {"RAY_TMPDIR": os.environ.get("RAY_TMPDIR")}
    # A short private temp dir: Ray's socket paths must stay under the Unix limit of 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="epray-", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(temp_dir)
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": CPUS_PER_NODE,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": True,  # Ray's state API (list_actors) and `ray logs` go through it
            "dashboard_host": "127.0.0.1",
            "dashboard_port": free_port(),
            # A node whose raylet is gone (tests/ray/test_ray_launcher.py removes one) is declared dead
            # after this many failed health checks this far apart: by default 5 x 3 s, here 3 x 1 s. A
            # check still fails only past its 10 s timeout, so a slow raylet on loaded cores is no loss.
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
        shutdown_at_exit=False,  # the fixture shuts it down; an exit hook would run after its GCS is gone
    )
    try:
        worker = cluster.add_node(num_cpus=CPUS_PER_NODE, node_ip_address="127.0.0.1")
        ray.init(address=cluster.address, log_to_driver=False)
        print(f"\nray test cluster: 2 nodes up in {time.monotonic() - started:.1f}s at {cluster.address}")
        yield RayCluster(
            address=cluster.address,
            head_node_id=str(cluster.head_node.node_id),  # type: ignore[attr-defined]
            worker_node_id=worker.node_id,
            cluster=cluster,
        )
    finally:
        ray.shutdown()
        # The Cluster's own GCS connection (its global state accessor, with a native I/O thread) must go
        # while the GCS still runs: left to the interpreter's exit, its destructor joined that thread with
        # the GIL held and the GCS gone, and the finished suite hung after its summary (seen 2 of 2 whole
        # runs, 3 and 24 minutes, until a debugger's attach woke the thread).
        cluster.global_state.disconnect()
        gc.collect()
        cluster.shutdown()  # the processes of the two nodes this fixture started, and nothing else
        shutil.rmtree(temp_dir, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
