"""The coordinator's OpenAPI document reads well in generated clients."""

from __future__ import annotations

from tests.support.openapi import document


def test_operation_ids_read_as_tag_and_name() -> None:
    doc = document("coordinator.json")
    ids = {op["operationId"] for path in doc["paths"].values() for op in path.values()}
    assert {
        "reconfigurations-create",
        "reconfigurations-cancel",
        "engines-register",
        "deployments-list",
    } <= ids


def test_errors_are_documented_as_problem_json() -> None:
    doc = document("coordinator.json")
    conflict = doc["paths"]["/v1/reconfigurations"]["post"]["responses"]["409"]["content"]
    assert list(conflict) == ["application/problem+json"]
