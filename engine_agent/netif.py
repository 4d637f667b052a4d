"""This host's network interfaces: the IPv4 address of an interface, and the interface of an address.

An agent binds its data plane (rendezvous store, gloo devices, the weight channel) to its data address,
which may be given as an interface (`--data-interface ib0`: a cluster's back-end fabric), and tells UCX
that interface (`UCX_NET_DEVICES`) so NIXL does not wander onto another network. Linux only (the
`SIOCGIFADDR` ioctl), stdlib only.
"""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915


def ipv4_of(interface: str) -> str:
    """The IPv4 address of `interface`; OSError if it has none (or does not exist)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
    return socket.inet_ntoa(packed[20:24])


def interface_of(address: str) -> str | None:
    """The interface that holds IPv4 `address`, if one of this host's does."""
    for _, name in socket.if_nameindex():
        try:
            if ipv4_of(name) == address:
                return name
        except OSError:
            continue
    return None
