"""Test hosts on one machine: Linux network namespaces joined by two bridges (issue 24).

`Hosts.build(n)` makes `n` namespaces `<prefix>h1..hN` and two bridges in the root namespace:

- a *control* bridge (front-end network) joining the root namespace (the coordinator, the tests'
  process, at `CONTROL_ROOT` = 198.18.0.254) and every host (`198.18.0.<i>`);
- a *data* bridge (back-end network) joining the hosts only (`198.18.1.<i>`), with no address in the
  root namespace, so the root namespace cannot reach any host's data address (the whole range is an
  `unreachable` route there while the hosts exist: the root's default route would take it off the
  machine).

Addresses come from the benchmarking range 198.18.0.0/15; the bridges are attached to no real interface
and no namespace has a default route, so no packet can leave the machine. A fault is one host's link
taken down on one network (`cut(host, "control" | "data")`, `mend(...)`): the host-side veth and its
bridge-side peer, so the host is cut off from that network alone.

`run_in(host, argv)` / `spawn_in(...)` run a process inside a host (`ip netns exec`); `enter(host)`
moves the calling *thread* into a host's namespace (`setns(2)`: network namespaces are per thread),
so a client thread of the test process can be a client on that host.

`close()` removes everything it made (namespaces, and with them their veths; the bridges), also after a
failure; `build` first sweeps leftovers of its own prefix (a run killed before its cleanup). Needs root
and `ip`; `unavailable()` says why a machine cannot have test hosts (tests skip with that reason).
Pytest-free, so benchmarks import it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Self

from tests.support.processes import Child, spawn

Network = Literal["control", "data"]
NETNS_DIR = Path("/var/run/netns")
CONTROL_ROOT = "198.18.0.254"
BENCH_RANGE = "198.18.0.0/15"
CONTROL_INTERFACE = "ctl0"
DATA_INTERFACE = "data0"
CLONE_NEWNET = 0x40000000
DEFAULT_PREFIX = "epct"  # short: interface names hold 15 characters


def control_address(index: int) -> str:
    return f"198.18.0.{index}"


def data_address(index: int) -> str:
    return f"198.18.1.{index}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why test hosts cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on this machine"
    if os.geteuid() != 0:
        return "test hosts (network namespaces) need root"
    probe = f"{DEFAULT_PREFIX}probe{os.getpid() % 1000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One test host: its namespace and its addresses on the two networks."""

    index: int  # 1-based
    netns: str
    control: str
    data: str

    @staticmethod
    def veth(network: Network) -> str:
        """The host side, inside its namespace: the same name on every host (`ctl0`, `data0`), as a
        cluster's nodes name their fabric alike (Ray's `data_interface` names one for all nodes)."""
        return CONTROL_INTERFACE if network == "control" else DATA_INTERFACE

    def peer(self, network: Network) -> str:
        """The bridge-side end (root namespace)."""
        return f"{self.netns}{network[0]}"


@dataclass
class Hosts:
    prefix: str = DEFAULT_PREFIX
    hosts: list[Host] = field(default_factory=list)
    _made_links: list[str] = field(default_factory=list)
    _made_route: bool = False

    @property
    def control_bridge(self) -> str:
        return f"{self.prefix}-ctl"

    @property
    def data_bridge(self) -> str:
        return f"{self.prefix}-dat"

    @classmethod
    def build(cls, count: int, prefix: str = DEFAULT_PREFIX) -> Self:
        made = cls(prefix=prefix)
        made.sweep()
        try:
            made._build(count)
        except BaseException:
            made.close()
            raise
        return made

    def _build(self, count: int) -> None:
        # The root namespace's default route leads off the machine: the range is unreachable from it
        # (the control bridge's /24 is more specific, so the hosts' control addresses still are reached).
        self._made_route = _ip("route", "add", "unreachable", BENCH_RANGE, check=False).returncode == 0
        for bridge, address in ((self.control_bridge, f"{CONTROL_ROOT}/24"), (self.data_bridge, None)):
            _ip("link", "add", bridge, "type", "bridge")
            self._made_links.append(bridge)
            if address:
                _ip("addr", "add", address, "dev", bridge)
            _ip("link", "set", bridge, "up")
        for index in range(1, count + 1):
            netns = f"{self.prefix}h{index}"
            host = Host(index, netns, control_address(index), data_address(index))
            _ip("netns", "add", netns)
            self.hosts.append(host)
            _ip("-n", netns, "link", "set", "lo", "up")
            for network, address, bridge in (
                ("control", host.control, self.control_bridge),
                ("data", host.data, self.data_bridge),
            ):
                veth, peer = host.veth(network), host.peer(network)  # type: ignore[arg-type]
                _ip("link", "add", peer, "type", "veth", "peer", "name", f"{peer}x")
                self._made_links.append(peer)
                _ip("link", "set", f"{peer}x", "netns", netns)
                _ip("-n", netns, "link", "set", f"{peer}x", "name", veth)  # one name on every host
                _ip("link", "set", peer, "master", bridge)
                _ip("link", "set", peer, "up")
                _ip("-n", netns, "addr", "add", f"{address}/24", "dev", veth)
                _ip("-n", netns, "link", "set", veth, "up")

    def sweep(self) -> None:
        """Remove namespaces and links of this prefix that a killed run left behind."""
        listed = _ip("netns", "list", check=False).stdout.split("\n")
        for line in listed:
            name = line.split(" ", 1)[0].strip()
            if name.startswith(self.prefix):
                _ip("netns", "del", name, check=False)
        links = _ip("-o", "link", "show", check=False).stdout.split("\n")
        for line in links:
            parts = line.split(": ")
            if len(parts) > 1:
                name = parts[1].split("@", 1)[0]
                if name.startswith(self.prefix):
                    _ip("link", "del", name, check=False)

    def close(self) -> None:
        """Remove everything made (namespaces take their veths with them), whatever state it is in."""
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)
        for link in reversed(self._made_links):
            _ip("link", "del", link, check=False)
        self.hosts.clear()
        self._made_links.clear()
        if self._made_route:
            _ip("route", "del", "unreachable", BENCH_RANGE, check=False)
            self._made_route = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, index: int) -> Host:
        """Host `index`, 1-based as the namespaces are named."""
        return self.hosts[index - 1]

    # --- faults -------------------------------------------------------------------------------------

    def cut(self, host: Host, network: Network) -> None:
        """Take `host`'s link on `network` down (both ends): it is cut off from that network alone."""
        _ip("-n", host.netns, "link", "set", host.veth(network), "down")
        _ip("link", "set", host.peer(network), "down")

    def mend(self, host: Host, network: Network) -> None:
        _ip("link", "set", host.peer(network), "up")
        _ip("-n", host.netns, "link", "set", host.veth(network), "up")

    @contextlib.contextmanager
    def cut_off(self, hosts: Sequence[Host], network: Network) -> Iterator[None]:
        for host in hosts:
            self.cut(host, network)
        try:
            yield
        finally:
            for host in hosts:
                self.mend(host, network)

    # --- processes in a host ------------------------------------------------------------------------

    @staticmethod
    def argv_in(host: Host, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", host.netns, *argv]

    def run_in(
        self, host: Host, argv: Sequence[str], timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv_in(host, argv), capture_output=True, text=True, timeout=timeout_s)

    def spawn_in(
        self,
        host: Host,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
    ) -> Child:
        """A child in its own session inside `host` (`ip netns exec` execs it: the pid is the process's)."""
        return spawn(name, self.argv_in(host, argv), log_path, env=env)


def enter(host: Host) -> None:
    """Move the calling thread into `host`'s network namespace (sockets it opens from now on are there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / host.netns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {host.netns}: {os.strerror(errno)}")
    finally:
        os.close(fd)
