"""kubectl pointed at the coordinator (`--server https://... --token ...`, nothing else): discovery finds
`epctl.io/v1` `deployments` and their `scale` subresource, so `kubectl get`, `kubectl scale`
(`--current-replicas` included: client-go's scale client, which GETs the Scale and PUTs it back without
Content-Type) and `kubectl patch --subresource=scale` work, and a refusal is printed as the API
server's (`Error from server (Conflict): ...`). kubectl sends a token over HTTPS only: the coordinator
(in this process, uvicorn in a thread) serves TLS with a CA made here."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.certs import TestCA
from tests.support.processes import ADMIN_TOKEN
from tests.support.served import served

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(
        shutil.which("kubectl") is None, reason="kubectl is not installed (Debian: kubernetes-client)"
    ),
]

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl(client: TestClient, tmp_path: Path) -> Iterator[Kubectl]:
    assert client.post("/v1/deployments", json={"name": "demo", "max_dp_size": 4}).status_code == 201
    ca = TestCA(tmp_path, "kubectl")
    files = ca.server("coordinator")
    with served(client.app, tls=(files.cert, files.key)) as url:
        base = ["kubectl", "--kubeconfig", "/dev/null", "--server", url, "--token", ADMIN_TOKEN]
        base += ["--certificate-authority", str(ca.ca_file), "--cache-dir", str(tmp_path / "kube-cache")]

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*base, *args], capture_output=True, text=True, timeout=120)

        yield run


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def _spec_replicas(client: TestClient) -> int:
    return int(client.get("/v1/deployments/demo/scale").json()["spec"]["replicas"])


def test_get_lists_the_deployments_as_a_table(kubectl: Kubectl) -> None:
    header, row = _ok(kubectl("get", "deployments")).splitlines()
    assert header.split() == ["NAME", "DESIRED", "CURRENT", "GENERATION", "STATUS", "AGE"]
    assert row.split()[:5] == ["demo", "0", "0", "0", "ready"]
    assert "kind: Deployment" in _ok(kubectl("get", "deployments.epctl.io", "demo", "-o", "yaml"))
    missing = kubectl("get", "deployments", "nope")
    assert missing.returncode == 1 and "Error from server (NotFound)" in missing.stderr


def test_scale_and_scale_with_current_replicas(kubectl: Kubectl, client: TestClient) -> None:
    assert "scaled" in _ok(kubectl("scale", "deployments", "demo", "--replicas=3"))
    assert _spec_replicas(client) == 3
    assert "scaled" in _ok(kubectl("scale", "deployments", "demo", "--current-replicas=3", "--replicas=2"))
    assert _spec_replicas(client) == 2
    refused = kubectl("scale", "deployments", "demo", "--current-replicas=3", "--replicas=4")
    assert refused.returncode == 1 and "Expected replicas to be 3, was 2" in refused.stderr
    assert _spec_replicas(client) == 2


def test_patch_the_scale_subresource(kubectl: Kubectl, client: TestClient) -> None:
    patch = '{"spec": {"replicas": 4}}'
    out = _ok(kubectl("patch", "deployments", "demo", "--subresource=scale", "--type=merge", "-p", patch))
    assert "scale.autoscaling/demo patched" in out and _spec_replicas(client) == 4
    shown = _ok(
        kubectl("get", "deployments", "demo", "--subresource=scale", "-o", "jsonpath={.spec.replicas}")
    )
    assert shown == "4"


def test_a_stale_resource_version_prints_the_conflict(kubectl: Kubectl, client: TestClient) -> None:
    patch = '{"metadata": {"resourceVersion": "0-0-0"}, "spec": {"replicas": 2}}'
    _ok(kubectl("scale", "deployments", "demo", "--replicas=3"))  # the version is no longer 0-0-0
    stale = kubectl("patch", "deployments", "demo", "--subresource=scale", "--type=merge", "-p", patch)
    assert stale.returncode == 1
    assert "Error from server (Conflict)" in stale.stderr
    assert 'the scale of deployment "demo" has been modified' in stale.stderr.replace("'", '"')
    assert _spec_replicas(client) == 3
    # `kubectl scale --resource-version` compares with the deployment's version, which is its Scale's.
    versioned = kubectl("scale", "deployments", "demo", "--resource-version=0-0-0", "--replicas=1")
    assert versioned.returncode == 1 and "Expected resource version to be 0-0-0" in versioned.stderr
