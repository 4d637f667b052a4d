"""`PATCH /v1/deployments/{name}/scale`: the patch forms `kubectl scale` and the client libraries send,
turned into the `Scale` a PUT would carry (then the same rules apply: `app.scale.service.put_scale`).

- `application/merge-patch+json` (RFC 7386), e.g. `{"spec": {"replicas": 3}}`; and
  `application/strategic-merge-patch+json`, which the `kubernetes` Python client sends for an object
  body and which, for a `Scale` (no lists), means the same.
- `application/json-patch+json` (RFC 6902): `test` on any path; `replace`/`add` on `/spec/replicas`
  and `/metadata/resourceVersion` only (nothing else of a Scale can be written); any other operation
  or path is a 422 `unsupported-patch`.

`metadata.resourceVersion` is a precondition only when the patch carries it (as the API server
treats it): set by a merge patch or a JSON patch `replace`/`add`, or tested by a JSON patch `test`
(a failed test of it is a 409, of anything else a 422 `patch-test-failed`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from app.core.errors import InvalidRequestError, UnsupportedMediaTypeError
from app.scale.models import Scale

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH)
WRITABLE = ("/spec/replicas", "/metadata/resourceVersion")
VERSION_PATH = "/metadata/resourceVersion"
REQUIRED_SECTIONS = ("apiVersion", "kind", "metadata", "spec")


class PatchTestFailed(InvalidRequestError):
    code = "patch-test-failed"


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge member by member, `null` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge(merged.get(key), value)
    return merged


def _pointer(document: dict[str, Any], path: str) -> Any:
    node: Any = document
    for part in path.lstrip("/").split("/") if path else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchTestFailed(f"test: {path} does not exist in the Scale")
    return node


def _apply_json_patch(document: dict[str, Any], operations: Any) -> tuple[dict[str, Any], str | None]:
    """The patched document and the resourceVersion the patch tests or sets (None: none)."""
    if not isinstance(operations, list):
        raise InvalidRequestError("a JSON patch is an array of operations (RFC 6902)", code="malformed-patch")
    precondition: str | None = None
    for index, operation in enumerate(operations):
        if not isinstance(operation, dict) or not isinstance(operation.get("op"), str):
            raise InvalidRequestError(
                f"operation {index} is not an object with an `op`", code="malformed-patch"
            )
        op, path = operation["op"], operation.get("path")
        if not isinstance(path, str) or ("value" not in operation and op in ("test", "replace", "add")):
            raise InvalidRequestError(
                f"operation {index} ({op}) needs a `path` and a `value`", code="malformed-patch"
            )
        value = operation.get("value")
        if op == "test":
            if path == VERSION_PATH:
                precondition = str(value)
            elif _pointer(document, path) != value:
                raise PatchTestFailed(f"test failed: {path} is {_pointer(document, path)!r}, not {value!r}")
            continue
        if op not in ("replace", "add") or path not in WRITABLE:
            raise InvalidRequestError(
                f"operation {index} ({op} {path}) is not supported on a Scale: only test (any path) and "
                f"replace/add of {' or '.join(WRITABLE)}",
                code="unsupported-patch",
            )
        section, field = path.lstrip("/").split("/")
        document.setdefault(section, {})[field] = value
        if path == VERSION_PATH:
            precondition = str(value)
    return document, precondition


def patched_scale(current: Scale, content_type: str, body: bytes) -> Scale:
    """The Scale the patch makes of `current`; its resourceVersion is the patch's precondition, if any.
    Raises 415 for another media type, 422 for a patch that cannot apply."""
    kind = media_type(content_type)
    if kind not in PATCH_TYPES:
        raise UnsupportedMediaTypeError(
            f"PATCH takes {', '.join(PATCH_TYPES)}; not {kind or 'no Content-Type'}",
            code="unsupported-media-type",
            accepted=list(PATCH_TYPES),
        )
    try:
        patch = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidRequestError(
            f"the patch is not JSON: {str(exc)[:200]}", code="malformed-patch"
        ) from None
    document = current.model_dump(mode="json", exclude_none=True)
    document.get("metadata", {}).pop("resourceVersion", None)  # a precondition only if the patch has one
    if kind == JSON_PATCH:
        document, precondition = _apply_json_patch(document, patch)
        if precondition is not None:
            document.setdefault("metadata", {})["resourceVersion"] = precondition
    else:
        if not isinstance(patch, dict):
            raise InvalidRequestError("a merge patch of a Scale is a JSON object", code="malformed-patch")
        removed = sorted(key for key in REQUIRED_SECTIONS if key in patch and patch[key] is None)
        if removed:  # `null` removes (RFC 7386), but a Scale without these is no Scale
            raise InvalidRequestError(
                f"the patch removes {', '.join(removed)}: a Scale always has them", code="malformed-patch"
            )
        document = merge(document, patch)
    try:
        return Scale.model_validate(document)
    except ValidationError as exc:
        summary = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise InvalidRequestError(
            f"the patched Scale is not valid: {summary}", code="invalid-scale"
        ) from None
