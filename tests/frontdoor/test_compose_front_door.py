"""docker-compose's front door: HAProxy with the configuration the keeper expects, its socket shared
with the coordinator, which is told to keep it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.frontdoor.haproxy import DoorConfig, render_config
from app.frontdoor.settings import load_front_doors
from tests.frontdoor.conftest import require_haproxy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "haproxy.cfg"


def _services() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert isinstance(services, dict)
    return services


def test_the_compose_haproxy_config_is_what_the_keeper_renders() -> None:
    rendered = render_config("/run/haproxy/admin.sock", [DoorConfig("demo", "*", 8001)], socket_mode="660")
    assert CONFIG.read_text().split("\n", 1)[1] == rendered + "\n"


def test_compose_runs_the_front_door_and_the_coordinator_keeps_it() -> None:
    services = _services()
    door = services["front-door"]
    assert door["image"].startswith("haproxy:")
    assert "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in door["volumes"]
    coordinator = services["coordinator"]
    (spec,) = load_front_doors(coordinator["environment"]["EPCTL_FRONT_DOORS"])
    assert (spec.deployment, spec.socket, spec.backend_name) == ("demo", "/run/haproxy/admin.sock", "ep_demo")
    shared = {v.split(":")[0] for v in door["volumes"]} & {v.split(":")[0] for v in coordinator["volumes"]}
    assert shared == {"haproxy-run"}


@pytest.mark.processes
def test_haproxy_accepts_the_compose_config() -> None:
    require_haproxy()
    from app.frontdoor.launch import haproxy_binary

    checked = subprocess.run([str(haproxy_binary()), "-c", "-f", str(CONFIG)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
