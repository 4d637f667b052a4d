"""The agent's OpenAPI document names the protocol's paths, with problem+json errors."""

from __future__ import annotations

from tests.support.openapi import document


def test_the_agent_document_has_the_protocol_paths_with_problem_json_errors() -> None:
    paths = document("agent.json")["paths"]
    for phase in ("prepare", "sync", "pause", "switch", "resume", "abort"):
        post = paths[f"/v1/reconfig/{phase}"]["post"]
        assert "202" in post["responses"]
        assert list(post["responses"]["409"]["content"]) == ["application/problem+json"]
    assert {"/healthz", "/metrics", "/v1/info", "/v1/infer", "/v1/reconfig", "/v1/cleanup"} <= set(paths)
    assert paths["/v1/reconfig/prepare"]["post"]["operationId"] == "reconfig-prepare"


def test_every_route_that_needs_the_key_documents_401_and_429() -> None:
    """The gate answers 401 (no or wrong key) and 429 (too many of those) on every keyed route; the
    document says so, with the scheme it needs. Open: liveness, metrics."""
    paths = document("agent.json")["paths"]
    keyed = 0
    for path, operations in paths.items():
        for method, operation in operations.items():
            if path in ("/healthz", "/metrics"):
                assert "security" not in operation and "401" not in operation["responses"], (method, path)
                continue
            keyed += 1
            assert {"401", "429"} <= set(operation["responses"]), (method, path)
            assert operation.get("security"), (method, path)
    assert keyed >= 14


def test_the_agent_docs_page_references_no_host_but_its_own() -> None:
    """/docs is Swagger UI from local assets, as the coordinator's: a key pasted into "Authorize" runs
    beside no third-party script."""
    import re

    from fastapi.testclient import TestClient

    from engine_agent.api import create_app

    client = TestClient(create_app(fault_injection=False))  # no lifespan: the docs need no agent
    page = client.get("/docs")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    references = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    local = [ref for ref in references if ref.startswith("/") and not ref.startswith("//")]
    assert references and local == references, references
    for ref in references:
        assert client.get(ref).status_code == 200, ref
    assert "http://" not in page.text and "https://" not in page.text
    assert client.get("/redoc").status_code == 503  # not served: keyed like any unknown path (starting)
    assert client.get("/openapi.json").status_code == 200
