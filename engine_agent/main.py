"""`epctl-agent`: one engine agent. Also the ASGI app `engine_agent.main:app` (settings from
EPCTL_AGENT_* variables; nothing heavy starts at import: the agent is built when the app is served)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time

import uvicorn
from pydantic import ValidationError

from engine_agent.api import create_app
from engine_agent.engine_options import add_engine_options
from engine_agent.logs import LOG_FORMATS, configure_logging, set_process_fields
from engine_agent.protocol import Platform
from engine_agent.settings import AgentSettings

__all__ = ["app", "create_app", "main"]

app = create_app()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epctl-agent", description="Run one engine agent (reference MoE engine)."
    )
    p.add_argument("--host", default="127.0.0.1", help="the control address (HTTP API)")
    p.add_argument(
        "--data-host",
        help="the data address: rendezvous store, gloo devices, weight channel (default: --host)",
    )
    p.add_argument("--data-interface", help="the data address as an interface (e.g. ib0), if no --data-host")
    p.add_argument(
        "--port", type=int, default=0, help="0: pick a free port (printed, and written to --ready-file)"
    )
    p.add_argument("--url", help="the URL to advertise (default http://host:port)")
    p.add_argument("--engine-id")
    p.add_argument("--platform", choices=[p.value for p in Platform], default="cpu")
    p.add_argument("--device", help="cpu, or cuda:N on cuda/rocm (default cuda:0)")
    add_engine_options(p)  # the engine's shape: one option per field of EngineConfig
    p.add_argument(
        "--grouped-step",
        choices=["auto", "on", "off"],
        default="auto",
        help="a layer's experts in two batched matmuls (on) or one at a time (off); auto: batched on GPU",
    )
    p.add_argument("--coordinator", help="coordinator base URL: register there and send heartbeats")
    p.add_argument("--deployment", help="the deployment to register into")
    p.add_argument(
        "--token",
        default=os.environ.get("EPCTL_TOKEN"),
        help="bearer token (default $EPCTL_TOKEN; prefer the variable or --token-file: argv is public)",
    )
    p.add_argument("--token-file", help="read the bearer token from this file (first line)")
    p.add_argument("--heartbeat-s", type=float, default=3.0)
    p.add_argument(
        "--parent-pid",
        type=int,
        help="opt-in orphan exit, with --orphan-grace-s (throwaway machines only): the launcher's pid; "
        "once it is gone, exit unless a coordinator answers the heartbeats within the grace",
    )
    p.add_argument(
        "--orphan-grace-s",
        type=float,
        default=None,
        help="off by default: the engine serves however long no coordinator answers",
    )
    p.add_argument(
        "--enable-fault-injection", action="store_true", help="accept POST /v1/faults (tests only)"
    )
    p.add_argument(
        "--insecure-no-agent-key",
        action="store_true",
        help="development only: serve the control routes to anyone (the key is EPCTL_AGENT_KEY, "
        "from the environment only: argv is public)",
    )
    p.add_argument("--ready-file", help="write the bound URL here once HTTP is served")
    # Unset options keep their EPCTL_AGENT_TLS_* variables (a launcher's environment passes them on).
    p.add_argument("--tls-cert-file", default=argparse.SUPPRESS, help="serve HTTPS with this PEM certificate")
    p.add_argument("--tls-key-file", default=argparse.SUPPRESS, help="the certificate's PEM private key")
    p.add_argument(
        "--tls-ca-file",
        default=argparse.SUPPRESS,
        help="PEM CA bundle that https:// coordinators and peers must chain to (default: system trust)",
    )
    p.add_argument("--log-level", default="warning")
    p.add_argument(
        "--log-format",
        default=os.environ.get("EPCTL_LOG_FORMAT", "text"),
        help="text, or json: one JSON object per line with engine_id, deployment and job_id "
        "(default $EPCTL_LOG_FORMAT or text)",
    )
    return p


def bearer_token(args: argparse.Namespace) -> str | None:
    """--token-file wins over --token / $EPCTL_TOKEN (a file or the environment keeps it out of argv)."""
    if args.token_file:
        with open(args.token_file) as token_file:
            return token_file.readline().strip() or None
    token: str | None = args.token
    return token


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.log_format not in LOG_FORMATS:  # checked here too: the default comes from the environment
        parser.error(f"--log-format / EPCTL_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, "
                     f"not {args.log_format!r}")  # fmt: skip
    configure_logging(args.log_format, args.log_level)
    args.token = bearer_token(args)
    # Bind first, so port 0 resolves to a real port before the agent (and its URL) exists.
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted connections of a socket whose
    # proto says TCP; with proto 0 Nagle holds every response ~40 ms (it dominated the commit window).
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    try:
        settings = AgentSettings.from_options(args, port=port)
    except ValidationError as exc:
        parser.error(
            "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        )
    if (refusal := settings.missing_key()) is not None:
        parser.error(refusal)
    url = settings.served_url(port)
    set_process_fields(engine_id=settings.resolved_engine_id(os.getpid()), deployment=settings.deployment)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, url=url),
            log_level=args.log_level,
            log_config=None,  # uvicorn's loggers go through the handler configure_logging set up
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=3,  # requests stalled by a pause must not hold a shutdown
            # Longer than any client's keep-alive expiry (the coordinator's is 2 s): an idle
            # connection must never be closed here just as the client reuses it for a phase call.
            timeout_keep_alive=75,
            ssl_certfile=settings.tls_cert_file,
            ssl_keyfile=settings.tls_key_file,
        )
    )

    def announce_ready() -> None:
        while not server.started:
            if server.should_exit:
                return
            time.sleep(0.01)
        print(url, flush=True)
        if settings.ready_file:
            tmp = f"{settings.ready_file}.tmp"
            with open(tmp, "w") as f:
                f.write(url + "\n")
            os.replace(tmp, settings.ready_file)  # readers never see a half-written file

    threading.Thread(target=announce_ready, name="ready", daemon=True).start()
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
