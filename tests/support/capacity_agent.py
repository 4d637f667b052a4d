"""A local agent command with a capacity, for partial-growth tests (issue 38): `<state dir>/capacity`
holds how many more agents may start; each start takes one (under a lock) and, once none is left, the
agent exits at once with code 3, as a launch that fails. No such file: no limit.

The local launcher runs it as `python capacity_agent.py <the agent's arguments>` (the coordinator's
`EPCTL_RUNNER_LOCAL_AGENT_COMMAND`); the state dir is where the launcher puts the ready file's folder."""

from __future__ import annotations

import fcntl
import sys
from pathlib import Path

CAPACITY_FILE = "capacity"


def take_one(capacity: Path) -> bool:
    """Whether this start fits (and count it)."""
    if not capacity.exists():
        return True
    with capacity.open("r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        left = int(handle.read().strip() or 0)
        if left <= 0:
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(str(left - 1))
    return True


def main() -> None:
    args = sys.argv[1:]
    ready_file = Path(args[args.index("--ready-file") + 1])  # <state dir>/agents/<engine>.ready
    if not take_one(ready_file.parent.parent / CAPACITY_FILE):
        print("capacity_agent: no capacity left", file=sys.stderr)
        raise SystemExit(3)
    from engine_agent.main import main as agent_main

    sys.argv = ["epctl-agent", *args]
    agent_main()


if __name__ == "__main__":
    main()
