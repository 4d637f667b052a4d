"""A static deployment and its registered CPU engines, made through the API (the heartbeat tests, the
spare keeper's, and `benchmarks/heartbeat_profile.py`): the calls as data, for any HTTP client, and
`make_fleet` for a test's client."""

from __future__ import annotations

from typing import Any, Protocol


class Poster(Protocol):
    """A synchronous HTTP client (`TestClient`, `httpx.Client`)."""

    def post(self, url: str, *, json: Any = ...) -> Any: ...


def fleet_calls(
    engines: int, deployment: str = "demo", *, engine_prefix: str = ""
) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of each POST, in order: the deployment (launcher `static`), then engines
    `{engine_prefix}e0`, `e1`, ... each on a port of its own (nothing listens: no agent is called)."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("/v1/deployments", {"name": deployment, "launcher": "static"})
    ]
    for i in range(engines):
        engine = {
            "engine_id": f"{engine_prefix}e{i}",
            "deployment": deployment,
            "url": f"http://127.0.0.1:{9000 + i}",
            "platform": "cpu",
            "device": "cpu",
            "engine": {},
        }
        calls.append(("/v1/engines", engine))
    return calls


def make_fleet(client: Poster, engines: int, deployment: str = "demo", *, engine_prefix: str = "") -> None:
    """Make the fleet through `client`; every call must create (201)."""
    for path, body in fleet_calls(engines, deployment, engine_prefix=engine_prefix):
        response = client.post(path, json=body)
        assert response.status_code == 201, (path, response.status_code, response.text)
