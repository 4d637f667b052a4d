"""Issue 17, finding 11: `epctl tokens create|list|revoke`, with `--json` before or after the command,
through the console script's code path in a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.processes import ROOT
from tests.support.processes import Coordinator as CoordinatorProcess


def epctl(
    coordinator: CoordinatorProcess, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed console script's code path (`main`), in a real process."""
    env = {**os.environ, "EPCTL_URL": coordinator.url, "EPCTL_TOKEN": token or coordinator.admin_token}
    command = [sys.executable, "-c", "from app.cli.main import main; main()", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_tokens_create_list_revoke(coordinator: CoordinatorProcess) -> None:
    created = epctl(coordinator, "--json", "tokens", "create", "ci-reader", "--role", "viewer")
    assert created.returncode == 0, created.stderr
    token = json.loads(created.stdout)
    assert token["role"] == "viewer" and token["token"].startswith("epctl_")

    plain = epctl(coordinator, "tokens", "create", "ci-scaler", "-r", "autoscaler")
    assert plain.returncode == 0 and plain.stdout.strip().startswith("epctl_"), plain.stderr

    listed = epctl(coordinator, "tokens", "--json", "list")
    names = {t["name"]: t for t in json.loads(listed.stdout)["data"]}
    assert {"ci-reader", "ci-scaler"} <= set(names)
    assert all("token" not in t for t in names.values())  # secrets are never listed

    assert epctl(coordinator, "jobs", "list", token=token["token"]).returncode == 0
    revoked = epctl(coordinator, "tokens", "revoke", "ci-reader")
    assert revoked.returncode == 0 and "revoked ci-reader" in revoked.stdout
    refused = epctl(coordinator, "jobs", "list", token=token["token"])
    assert refused.returncode == 1 and "revoked" in refused.stderr

    bad_role = epctl(coordinator, "tokens", "create", "x", "--role", "root")
    assert bad_role.returncode == 2
