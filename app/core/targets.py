"""Where a webhook may be delivered (the coordinator calls a URL a caller chose): public addresses only,
unless the operator allow-lists networks.

A subscription's URL is the coordinator's own request to a place a caller chose: left open, it reaches
the cloud's metadata service, the database, an engine's control port or anything else on the
coordinator's networks, and its answers (status, timing) tell a port scan what is there. So a target is
refused when it is, or resolves to, a loopback, link-local (metadata services: 169.254.169.254,
fd00:ec2::254), private, shared (100.64/10, Alibaba's metadata 100.100.100.200), unspecified, multicast,
reserved or otherwise non-global address, in every spelling (decimal `2130706433`, hex `0x7f000001`,
short `127.1`, octal, IPv6 and IPv4-mapped `::ffff:127.0.0.1`, 6to4 and NAT64 forms that embed one),
and a few names whatever they resolve to (`localhost`, `*.localhost`, the metadata services' names).

It is checked twice: when the subscription is made or changed (the URL's host, and what it resolves to
now), and at every delivery, after resolution, where the connection then goes to the address checked
(pinned: the name is sent as `Host` and as the TLS server name), so a name that resolves inside later
(DNS rebinding) is refused then.

`EPCTL_WEBHOOK_ALLOW_NETWORKS` (CIDRs, comma-separated; empty by default) lets the operator deliver
inside, e.g. `127.0.0.0/8,::1/128` for a receiver on the coordinator's host, or a private range.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

BLOCKED_NAMES = frozenset(
    {
        "localhost",
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.internal",
    }
)
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_IPV4_SPELLING = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)
ALLOW_HINT = "EPCTL_WEBHOOK_ALLOW_NETWORKS"


class TargetRefused(ValueError):
    """A webhook target the coordinator will not call; the message says why, in a few words."""


def networks(text: str | Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs (a comma-separated string or a list) as networks; ValueError names a bad one."""
    items = text.split(",") if isinstance(text, str) else list(text)
    found: list[IPNetwork] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            found.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not a network (CIDR such as 10.0.0.0/8 or ::1/128)") from None
    return tuple(found)


def literal_address(host: str) -> IPAddress | None:
    """The address a host written as an IP literal stands for, in any spelling a resolver accepts
    (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`, `[::ffff:127.0.0.1]`); None for a name."""
    text = host.strip("[]").split("%", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _IPV4_SPELLING.match(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def _embedded(ip: IPAddress) -> list[IPAddress]:
    """The IPv4 addresses an IPv6 address carries (mapped, 6to4, Teredo, NAT64), to judge too."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    inner: list[IPAddress] = []
    if ip.ipv4_mapped is not None:
        inner.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        inner.append(ip.sixtofour)
    if ip.teredo is not None:
        inner.extend(ip.teredo)
    if ip in NAT64:
        inner.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return inner


def why_not(ip: IPAddress) -> str | None:
    """Why the coordinator will not deliver to `ip` (a few words), or None when it is public."""
    for inner in _embedded(ip):
        reason = why_not(inner)
        if reason is not None:
            return f"{reason} (inside {ip})"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (metadata services live there)"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "not a public address"
    return None


def allowed(ip: IPAddress, allow: Sequence[IPNetwork]) -> bool:
    plain = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip
    return any(plain.version == net.version and plain in net for net in allow) or why_not(ip) is None


def _refusal(host: str, ip: IPAddress) -> TargetRefused:
    shown = host if host == str(ip) else f"{host} ({ip})"
    return TargetRefused(
        f"the target {shown} is {why_not(ip)}: webhooks go to public addresses only (an operator may "
        f"allow networks with {ALLOW_HINT})"
    )


def check_host(url: str, allow: Sequence[IPNetwork]) -> str:
    """The URL's host if nothing in how it is written forbids it (a literal address outside `allow`, or
    a blocked name); raises `TargetRefused`. No resolution: see `resolve_checked`."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if not host:
        raise TargetRefused("the target has no host")
    ip = literal_address(host)
    if ip is not None:
        if not allowed(ip, allow):
            raise _refusal(host, ip)
        return host
    if (host in BLOCKED_NAMES or host.endswith(".localhost")) and not allow:
        raise TargetRefused(
            f"the target {host} names this host or a metadata service: webhooks go to public addresses "
            f"only (an operator may allow networks with {ALLOW_HINT})"
        )
    return host


Resolver = Callable[[str, int], Awaitable[list[tuple[Any, ...]]]]


async def system_resolver(host: str, port: int) -> list[tuple[Any, ...]]:
    """`getaddrinfo`, as the HTTP client itself would resolve the name."""
    return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)


resolver: Resolver = system_resolver  # tests put a stand-in DNS here (no real one answers as they need)


async def resolve_checked(url: str, allow: Sequence[IPNetwork]) -> list[IPAddress]:
    """Every address the URL's host resolves to now, each checked (one outside `allow` refuses the
    target: a resolver may answer with several, and a client may use any); raises `TargetRefused`, or
    `socket.gaierror` when the name does not resolve."""
    host = check_host(url, allow)
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    infos = await resolver(host, port)
    addresses: list[IPAddress] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not allowed(ip, allow):
            raise _refusal(host, ip)
        if ip not in addresses:
            addresses.append(ip)
    return addresses


async def check_subscription_target(url: str, allow: Sequence[IPNetwork]) -> None:
    """At subscription time: the host as written, and what it resolves to now (a name that does not
    resolve yet is taken: every delivery checks it again)."""
    try:
        await resolve_checked(url, allow)
    except (socket.gaierror, UnicodeError):
        return
