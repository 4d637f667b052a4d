"""The coordinator (uvicorn `app.main:app`) with a stack sampler: where its CPU goes under a fleet.

Every `--interval-ms` a thread reads every other thread's stack (`sys._current_frames`), drops stacks
that wait (the event loop's select, a pool worker's queue, a lock), and counts each function once per
sample in which it is on a running stack (inclusive) and at its leaf (exclusive). When uvicorn stops
(SIGTERM), the top functions go to OUT. No dependency beyond the standard library.

    .venv/bin/python benchmarks/coordinator_profile.py OUT --port 8080     (env: as the coordinator's)
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IDLE_LEAVES = {
    "select",
    "poll",
    "wait",
    "_worker",
    "acquire",
    "get",
    "sleep",
    "_wait_for_tstate_lock",
    "run_forever",
}


def _where(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("/site-packages/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{code.co_name}"


class Sampler(threading.Thread):
    def __init__(self, interval_s: float, out: Path | None = None) -> None:
        super().__init__(daemon=True, name="stack-sampler")
        self.interval_s = interval_s
        self.out = out  # rewritten every 10 s: a coordinator killed before its clean stop leaves it too
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.exclusive: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.busy = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        written = time.monotonic()
        while not self.stopping.wait(self.interval_s):
            self.samples += 1
            if self.out is not None and time.monotonic() - written > 10.0:
                self.out.write_text(self.report())
                written = time.monotonic()
            for ident, frame in sys._current_frames().items():
                if ident == me or frame.f_code.co_name in IDLE_LEAVES:
                    continue
                self.busy += 1
                self.exclusive[_where(frame)] += 1
                seen: set[str] = set()
                f: FrameType | None = frame
                while f is not None:
                    where = _where(f)
                    if where not in seen:
                        seen.add(where)
                        self.inclusive[where] += 1
                    f = f.f_back

    def report(self, top: int = 60) -> str:
        lines = [f"samples {self.samples}, busy thread-samples {self.busy}", "", "## inclusive"]
        lines += [
            f"{n:7d} {100 * n / max(self.busy, 1):5.1f}%  {w}" for w, n in self.inclusive.most_common(top)
        ]
        lines += ["", "## exclusive (leaf)"]
        lines += [
            f"{n:7d} {100 * n / max(self.busy, 1):5.1f}%  {w}" for w, n in self.exclusive.most_common(top)
        ]
        return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    args = parser.parse_args()
    import uvicorn

    sampler = Sampler(args.interval_ms / 1000.0, Path(args.out))
    sampler.start()
    started = time.time()
    try:
        uvicorn.run("app.main:app", host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    finally:
        sampler.stopping.set()
        sampler.join(2)
        Path(args.out).write_text(f"wall {time.time() - started:.1f} s\n" + sampler.report())


if __name__ == "__main__":
    main()
