"""What-if wrapper for benchmarks/downtime.py --what-if-agent-nodelay: `epctl-agent` with its listening
socket created as an explicit TCP socket.

Why: `engine_agent/main.py` binds `socket.socket(AF_INET, SOCK_STREAM)` (proto 0) and hands it to
uvicorn. asyncio only sets TCP_NODELAY on accepted sockets whose `proto` is IPPROTO_TCP, so every
response of the agent (headers and body written separately) waits for the client's delayed ACK:
measured here 44-52 ms per agent call, against ~1 ms with the socket created with proto IPPROTO_TCP.
Each commit window holds at least one such call. This wrapper changes only that argument, so the
benchmark can show what the one-line fix in the agent would buy; it is not the product.
"""

from __future__ import annotations

import socket
import sys

_original_socket = socket.socket


class _TcpSocket(_original_socket):
    def __init__(self, family: int = -1, type: int = -1, proto: int = -1, fileno: int | None = None) -> None:
        if (
            fileno is None
            and proto in (-1, 0)
            and type == socket.SOCK_STREAM
            and family
            in (
                socket.AF_INET,
                socket.AF_INET6,
            )
        ):
            proto = socket.IPPROTO_TCP
        super().__init__(family, type, proto, fileno)


def main() -> int:
    import engine_agent.main as agent_main

    agent_main.socket.socket = _TcpSocket  # type: ignore[misc]
    return int(agent_main.main(sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
