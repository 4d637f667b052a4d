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
