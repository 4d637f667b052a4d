"""Which CA `epctl up`'s front door verifies its engines with, and the slot settings that follow (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.front_door import agent_tls_ca
from app.frontdoor.haproxy import SLOT_MAXCONN, add_server_command, slot_options


@pytest.mark.parametrize(
    ("ca_file", "environ", "expected"),
    [
        (None, {}, None),  # agents serve plain HTTP: so do the slots
        (Path("/pki/ca.pem"), {}, None),  # a CA for the coordinator's calls alone changes nothing
        (Path("/pki/ca.pem"), {"EPCTL_AGENT_TLS_CERT_FILE": "/pki/agent.pem"}, "/pki/ca.pem"),
        (None, {"EPCTL_AGENT_TLS_CERT_FILE": "/pki/agent.pem"}, "@system-ca"),  # as the coordinator does
    ],
)
def test_the_front_door_verifies_https_agents_with_the_coordinators_ca(
    ca_file: Path | None, environ: dict[str, str], expected: str | None
) -> None:
    assert agent_tls_ca(ca_file, environ) == expected


def test_template_and_added_slots_speak_tls_alike() -> None:
    tls = f"disabled maxconn {SLOT_MAXCONN} ssl verify required ca-file /pki/ca.pem"
    assert slot_options("/pki/ca.pem") == tls
    assert slot_options(None) == f"disabled maxconn {SLOT_MAXCONN}"
    assert add_server_command("ep_fd", "e33", "/pki/ca.pem") == f"add server ep_fd/e33 127.0.0.1:1 {tls}"
