"""TLS where traffic crosses machines: the contexts a client verifies its server with, and the checks
a server's certificate and key pass before it starts. Shared by the agent and the coordinator
(torch-free, standard library only).

A client context verifies the server's certificate and host name against the operator's CA bundle
(or the system's trust store when none is given); a plain `http://` URL never uses it."""

from __future__ import annotations

import ssl
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=8)
def client_context(ca_file: str | None) -> ssl.SSLContext:
    """A client context verifying servers against `ca_file` (PEM), or the system's trust store. Built
    once per bundle: loading a CA bundle costs milliseconds, and contexts are shared safely."""
    context = ssl.create_default_context(cafile=ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def checked_server_pair(cert_file: Path | str | None, key_file: Path | str | None, what: str) -> None:
    """ValueError unless both or neither of a server's certificate and key are given, and a given pair
    loads (readable PEM, the key matching the certificate): a bad pair stops start-up in one line, not
    at the first client's handshake."""
    if (cert_file is None) != (key_file is None):
        raise ValueError(f"{what}: a TLS certificate needs its key and a key its certificate")
    if cert_file is None or key_file is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"{what}: cannot load TLS certificate {cert_file} with key {key_file}: {exc}"
        ) from None


def checked_ca_file(ca_file: Path | str | None, what: str) -> None:
    """ValueError unless a given CA bundle loads."""
    if ca_file is None:
        return
    try:
        client_context(str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"{what}: cannot load CA bundle {ca_file}: {exc}") from None


def scheme(cert_file: Path | str | None) -> str:
    """`https` when the server has a certificate, else `http`."""
    return "https" if cert_file else "http"


_peer_ca_file: str | None = None


def use_peer_ca(ca_file: str | None) -> None:
    """The CA bundle this process's calls to `https://` peers verify against (the agent's
    `tls_ca_file`, set once as the agent is built); None: the system's trust store."""
    global _peer_ca_file
    _peer_ca_file = ca_file


def peer_context() -> ssl.SSLContext:
    """What a call to an `https://` peer verifies its certificate with."""
    return client_context(_peer_ca_file)
