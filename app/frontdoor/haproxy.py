"""HAProxy as a front door: its configuration (one frontend and one backend of server-template slots per
deployment, so the rank set changes through the Runtime API without a reload) and a small client of its
Runtime API (the admin stats socket: one command line per connection).

Why the configuration looks as it does:
- `server-template e 1-N 127.0.0.1:1 disabled`: N empty slots; the keeper points one at an engine
  (`set server B/eK addr IP port P`) and sets its state (`ready`, `drain`, `maint`).
- `retry-on conn-failure empty-response 503` with `retries` and `option redispatch 1`: a request that
  meets an engine that just died, or one that stopped admitting (503), is sent again to another
  ready engine, so a short gap between the record and the front door is not a client error.
- `timeout server` above the longest commit window: requests that arrive inside the window are held by
  the engines (they wait for the resume) and answered after it; `timeout queue` and each slot's `maxconn`
  make a burst wait at the front door rather than fail.
- No engine ready (a broken group re-forming after a kill): HAProxy 2.6 answers 503 at once when no
  server is usable (`assign_server`: `tot_weight` 0 is SRV_STATUS_NOSRV, never queued), and queues a
  request only when usable servers are all full. So each backend keeps a `backup` server, `hold`, that
  is always usable and full: `maxconn 1`, pointing at a frontend of this same HAProxy that sends the
  request back into the backend, where (the one slot taken by that very request) it waits in the
  backend's queue. `option allbackups` makes leastconn pass over a full backup (else the first backup is
  chosen full or not, and requests wait in its own queue, which no other server takes from). The moment
  the keeper sets a slot `ready`, HAProxy hands it the queue (`pendconn_grab_from_px`). A request waits
  at most `timeout queue` for an engine, then is answered 503 (the one that took the `hold` slot 504:
  its 503 must not start the outer request's retries, each of which would wait as long again).
- Who sent each request: the frontend counts its requests in a stick table of its own (`fd_NAME`) under
  two keys, `canary` (a request with our canaries' header, `CANARY_HEADER`) and `client` (any other),
  so a job's accounting says how many of its requests were clients' (`show table`, `senders`). Counted
  once per request as it arrives, whatever the backend then does with it (retries, the `hold` loop);
  lossless, unlike the request log (a Unix datagram socket drops what its reader did not take in time).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from app.frontdoor.requestlog import LOG_FORMAT
from app.probe.canary import CANARY_HEADER

SLOTS = 32
HOLD_SERVER = "hold"  # the backup server that makes requests wait while no engine is ready
PARKED = ("127.0.0.1", 1)  # where an unused slot points
SLOT_MAXCONN = 64  # requests one engine is sent at once; more wait in the backend's queue
QUEUE_TIMEOUT_S = 10  # the longest a request waits at the front door for an engine (`timeout queue`)


@dataclass(frozen=True)
class DoorConfig:
    deployment: str
    bind_host: str
    bind_port: int
    slots: int = SLOTS
    hold_socket: str | None = None  # where the `hold` frontend listens (None: beside the admin socket)
    # The CA bundle that signed the engines' certificates, for engines serving HTTPS (`slot_options`).
    tls_ca_file: str | None = None

    @property
    def backend(self) -> str:
        return backend_name(self.deployment)

    def hold_path(self, admin_socket: str) -> str:
        return self.hold_socket or str(PurePosixPath(admin_socket).parent / f"hold-{self.deployment}.sock")


def backend_name(deployment: str) -> str:
    return f"ep_{deployment}"


def frontend_name(deployment: str) -> str:
    """The deployment's frontend, and its stick table of requests by sender (`senders`)."""
    return f"fd_{deployment}"


SENDERS = ("client", "canary")  # the keys of a frontend's stick table: who sent the requests it counts
SENDER_COUNTERS = "http_req_cnt,http_fail_cnt"


def render_config(
    socket_path: str,
    doors: list[DoorConfig],
    *,
    server_timeout_s: float = 120.0,
    socket_mode: str = "600",
    request_log: str | None = None,
    queue_timeout_s: int = QUEUE_TIMEOUT_S,
    hold: bool = True,
) -> str:
    """`hold`: requests wait (at most `queue_timeout_s`) while no engine is ready, rather than meet
    HAProxy's immediate 503. `socket_mode` 660 where the coordinator reaches the socket as another user
    (docker-compose).
    `request_log`: a Unix datagram socket the keeper binds, to which HAProxy logs every request
    (`app.frontdoor.requestlog`)."""
    logging = [f"    log {request_log} len 1024 local0 info"] if request_log else []
    log_format = ["    log global", f'    log-format "{LOG_FORMAT}"'] if request_log else []
    lines = [
        "global",
        f"    stats socket {socket_path} mode {socket_mode} level admin",
        "    maxconn 4096",
        *logging,
        "",
        "defaults",
        "    mode http",
        *log_format,
        "    option http-keep-alive",
        "    timeout connect 1s",
        "    timeout client 120s",
        f"    timeout server {int(server_timeout_s)}s",
        f"    timeout queue {int(queue_timeout_s)}s",
        "    retries 3",
        "    retry-on conn-failure empty-response 503",
        "    option redispatch 1",
        "",
    ]
    for door in doors:
        hold_path = door.hold_path(socket_path)
        canary = f"{{ req.hdr({CANARY_HEADER}) -m found }}"
        lines += [
            f"frontend {frontend_name(door.deployment)}",
            f"    bind {door.bind_host}:{door.bind_port}",
            f"    stick-table type string len 8 size {len(SENDERS)} store {SENDER_COUNTERS}",
            f"    http-request track-sc0 str(canary) if {canary}",
            f"    http-request track-sc0 str(client) unless {canary}",
            f"    default_backend {door.backend}",
            "",
        ]
        if hold:
            lines += [
                f"frontend hold_{door.deployment}",
                f"    bind unix@{hold_path} mode 600",
                "    http-request set-log-level silent",  # its client's own request is logged
                "    http-after-response set-status 504 if { status 503 }",
                f"    default_backend {door.backend}",
                "",
            ]
        lines += [
            f"backend {door.backend}",
            "    balance leastconn",
            *(["    option allbackups"] if hold else []),
            f"    server-template e 1-{door.slots} {PARKED[0]}:{PARKED[1]} {slot_options(door.tls_ca_file)}",
            *([f"    server {HOLD_SERVER} unix@{hold_path} backup maxconn 1"] if hold else []),
            "",
        ]
    return "\n".join(lines)


class HaproxyError(Exception):
    """HAProxy refused a command, or its socket did not answer."""


class RuntimeApi:
    """HAProxy's Runtime API over its stats socket."""

    def __init__(self, socket_path: str, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    async def command(self, line: str) -> str:
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
                try:
                    writer.write(line.encode() + b"\n")
                    await writer.drain()
                    return (await reader.read()).decode()
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            raise HaproxyError(f"HAProxy's runtime API at {self.socket_path}: {exc}") from exc

    async def run(self, commands: list[str]) -> None:
        """Several commands in one exchange (`;`-separated); any answer but an empty one or a known
        harmless notice is an error."""
        if not commands:
            return
        answer = await self.command("; ".join(commands))
        bad = [part for part in answer.split("\n") if part.strip() and not _harmless(part)]
        if bad:
            raise HaproxyError(f"HAProxy refused {commands}: {' | '.join(bad)}")

    async def servers(self, backend: str) -> dict[str, ServerState]:
        """`show servers state BACKEND`, by server name."""
        answer = await self.command(f"show servers state {backend}")
        lines = [line for line in answer.splitlines() if line.strip()]
        header = next((line[2:].split() for line in lines if line.startswith("# ")), None)
        if header is None:
            raise HaproxyError(f"unexpected answer to show servers state: {answer[:200]!r}")
        states = {}
        for line in lines:
            if line.startswith("#") or len(line.split()) != len(header):
                continue
            row = dict(zip(header, line.split(), strict=True))
            states[row["srv_name"]] = ServerState(
                name=row["srv_name"],
                host=row["srv_addr"],
                port=int(row["srv_port"]),
                admin=int(row["srv_admin_state"]),
            )
        return states

    async def counters(self, backend: str) -> dict[str, dict[str, int]]:
        """Per server and for the backend (`BACKEND`): HAProxy's request counters (`show stat`)."""
        answer = await self.command("show stat")
        lines = answer.splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        header = lines[0][2:].split(",")
        wanted = (
            "stot",
            "qcur",
            "qmax",
            "scur",
            "econ",
            "eresp",
            "wretr",
            "wredis",
            "hrsp_2xx",
            "hrsp_5xx",
            "qtime",
        )
        found: dict[str, dict[str, int]] = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") != backend:
                continue
            found[row["svname"]] = {k: int(row[k]) for k in wanted if row.get(k, "").isdigit()}
        return found

    async def senders(self, frontend: str) -> dict[str, dict[str, int]]:
        """`show table FRONTEND`: its requests by sender (`client`, `canary`), each with HAProxy's
        `http_req_cnt` and `http_fail_cnt` (5xx answers other than 501 and 505, and failed responses);
        a sender with no request yet has no entry. {} where the frontend has no such table (a HAProxy
        started with an older configuration)."""
        answer = await self.command(f"show table {frontend}")
        if not answer.startswith("# table:"):
            return {}
        return parse_table(answer)


def parse_table(answer: str) -> dict[str, dict[str, int]]:
    """`show table`'s entries (`0x..: key=client use=0 exp=0 http_req_cnt=3 ...`), by key: their
    integer counters."""
    found: dict[str, dict[str, int]] = {}
    for line in answer.splitlines():
        if line.startswith("#") or "key=" not in line:
            continue
        pairs = dict(part.split("=", 1) for part in line.split() if "=" in part)
        key = pairs.pop("key")
        found[key] = {name: int(value) for name, value in pairs.items() if value.isdigit()}
        for meta in ("use", "exp", "shard"):
            found[key].pop(meta, None)
    return found


def _harmless(part: str) -> bool:
    return (
        "no need to change" in part
        or part.startswith("IP changed from")
        or "port changed from" in part
        or part.startswith("New server registered")  # `add server`
        or part.startswith("server ssl setting updated")  # `set server ... ssl`
    )


def next_slot_name(names: list[str]) -> str:
    """The slot after the highest `eN` (`e33` after `e1`..`e32`)."""
    numbers = [int(name[1:]) for name in names if name.startswith("e") and name[1:].isdigit()]
    return f"e{max(numbers, default=0) + 1}"


def slot_options(tls_ca_file: str | None = None) -> str:
    """An engine slot's settings. `tls_ca_file`: the slot can speak TLS to an engine serving HTTPS,
    verifying its certificate against that bundle (`ssl verify required ca-file`); the keeper turns
    TLS on or off per slot after the engine's address (`set server ... ssl on|off`). HAProxy 2.6
    checks a certificate's host name only against an SNI or `verifyhost` name, fixed per server line,
    and a slot serves whichever engine the feed gives it: so it checks that the deployment's CA signed
    the certificate, not the name in it (docs/front-door.md)."""
    options = f"disabled maxconn {SLOT_MAXCONN}"
    return f"{options} ssl verify required ca-file {tls_ca_file}" if tls_ca_file else options


def add_server_command(backend: str, name: str, tls_ca_file: str | None = None) -> str:
    """A slot added at run time (HAProxy 2.6 `add server`), like the template's: parked, in
    maintenance (a dynamic server starts so) until the keeper points it at an engine and sets it ready.
    Its settings are those of `render_config`'s slots, written out: a dynamic server takes no
    `default-server` line."""
    return f"add server {backend}/{name} {PARKED[0]}:{PARKED[1]} {slot_options(tls_ca_file)}"


MAINT = 0x01
DRAIN = 0x08


@dataclass(frozen=True)
class ServerState:
    name: str
    host: str
    port: int
    admin: int  # HAProxy's admin state bits (0x01 forced maintenance, 0x08 forced drain, ...)

    @property
    def state(self) -> str:
        if self.admin & MAINT:
            return "maint"
        return "drain" if self.admin & DRAIN else "ready"


def host_port(address: str) -> tuple[str, int]:
    """An engine's serving address as the IP and port HAProxy needs (`set server ... addr` takes an IP)."""
    parts = urlsplit(address)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        host = str(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0])
    return host, port
