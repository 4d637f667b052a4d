"""The vLLM backend's canary probe: does `client_outage_ms` agree with vLLM's own 503 window, and
what does a canary cost the coordinator?

    .venv/bin/python benchmarks/vllm_probe.py [--delays 0.25 0.5 1 2] [--reps 3] [--interval 0.05]

Needs `.venv-vllm` (scripts/vllm-env). A real coordinator (uvicorn, job runner on, SQLite) drives jobs
against the stand-in vLLM server (`tests/vllm/standin_server.py`: vLLM's own `/scale_elastic_ep`
route and 503 middleware over a stand-in engine client that holds vLLM's scaling flag for `delay`
seconds and records exactly when it set and cleared it). Each job's `client_outage_ms` is compared
with that flag window, the true 503 window. Then the probe alone (a `CanaryRecorder` with the vLLM
canary, in this process) sends canaries to the stand-in for a few seconds: CPU per canary.

Targets: the probe agrees with the true window within two canary intervals (DESIGN.md: "within a
serving step or two"); a canary costs the coordinator at most 1 ms of CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from common import ROOT, Report, free_port, scratch_dir

sys.path.insert(0, str(ROOT))

from app.backends.vllm.canary import VllmCanary
from app.probe import CanaryRecorder

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
TOKEN = "bench-admin-token-0123456789abcdef"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def wait_http(url: str, timeout_s: float) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def start_standin(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = open(tmp / "standin.log", "ab")  # noqa: SIM115 - lives as long as the process
    process = subprocess.Popen(
        [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm" / "standin_server.py"), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/standin/state", 300)
    return process, url


def start_coordinator(tmp: Path, interval_s: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp / 'epctl.db'}",
        "EPCTL_DATA_DIR": str(tmp / "data"),
        "EPCTL_ADMIN_TOKEN": TOKEN,
        "EPCTL_RUNNER_ENABLED": "true",
        "EPCTL_RUNNER_POLL_INTERVAL_S": "0.1",
        "EPCTL_WEBHOOK_WORKER_ENABLED": "false",
        "EPCTL_VLLM_BASELINE_S": "1",
        "EPCTL_VLLM_CANARY_INTERVAL_S": str(interval_s),
        "EPCTL_VLLM_SCALE_DEADLINE_S": "60",
    }
    log = open(tmp / "coordinator.log", "ab")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", 60)
    return process, url


def run_job(api: httpx.Client, deployment: str, target: int) -> dict[str, Any]:
    response = api.post("/v1/reconfigurations", json={"deployment": deployment, "target_dp_size": target})
    response.raise_for_status()
    job_id = response.json()["id"]
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        job = api.get(f"/v1/reconfigurations/{job_id}").json()
        if job["terminal"]:
            return dict(job)
        time.sleep(0.1)
    raise RuntimeError(f"job {job_id} did not end")


async def probe_cost(standin: str, seconds: float, interval_s: float) -> dict[str, float]:
    canary = VllmCanary("standin-model", prompt="Hello")
    cpu0 = time.process_time()
    async with CanaryRecorder(canary, interval_s=interval_s) as recorder:
        recorder.set_targets([standin])
        await asyncio.sleep(seconds)
    await canary.aclose()
    cpu_ms = (time.process_time() - cpu0) * 1000.0
    figures = recorder.figures()
    return {
        "canaries": figures.sent,
        "failed": figures.failed,
        "cpu_ms_per_canary": cpu_ms / max(figures.sent, 1),
        "p50_ms": figures.latency_p50_ms_outside or 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--delays", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.05, help="canary interval (s)")
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        raise SystemExit("needs .venv-vllm: run scripts/vllm-env")
    report = Report("vllm_probe", parameters=vars(args))
    tmp = scratch_dir("vllm-probe")
    standin, standin_url = start_standin(tmp)
    coordinator, url = start_coordinator(tmp, args.interval)
    rows: list[list[Any]] = []
    diffs: list[float] = []
    try:
        with httpx.Client(base_url=url, headers=HEADERS, timeout=30) as api:
            body = {"name": "bench", "backend": "vllm", "launcher": "static", "max_dp_size": 4}
            api.post("/v1/deployments", json={**body, "vllm": {"url": standin_url}}).raise_for_status()
            size = 1
            for delay in args.delays:
                for _ in range(args.reps):
                    httpx.post(f"{standin_url}/standin/reset", timeout=10)
                    httpx.post(
                        f"{standin_url}/standin/configure",
                        json={"outcome": "success", "delay_s": delay},
                        timeout=10,
                    )
                    target = 2 if size == 1 else 1
                    label = f"{size} -> {target}"
                    job = run_job(api, "bench", target)
                    if job["state"] != "succeeded":
                        raise RuntimeError(f"job ended {job['state']}: {job['error']}")
                    size = target
                    state = httpx.get(f"{standin_url}/standin/state", timeout=10).json()
                    (set_at, cleared_at) = state["flag_windows"][0]
                    true_ms = (cleared_at - set_at) * 1000.0
                    client_ms = float(job["client_outage_ms"])
                    diffs.append(client_ms - true_ms)
                    probe = job["probe"]
                    rows.append(
                        [
                            delay,
                            label,
                            round(true_ms, 1),
                            round(client_ms, 1),
                            round(client_ms - true_ms, 1),
                            probe["canaries_failed"],
                            probe["phases"]["before"]["p99_ms"],
                            probe["phases"]["committing"]["p99_ms"],
                        ]
                    )
        report.add_table(
            "client_outage_ms against vLLM's own 503 window (the stand-in's flag)",
            [
                "delay s",
                "job",
                "true 503 window ms",
                "client_outage_ms",
                "diff ms",
                "canaries failed",
                "p99 before ms",
                "p99 committing ms",
            ],
            rows,
        )
        cost = asyncio.run(probe_cost(standin_url, 5.0, 0.01))
        report.add_table(
            "the probe alone: 100 canaries/s for 5 s to the stand-in, from this process",
            ["canaries", "failed", "CPU ms per canary", "p50 latency ms"],
            [[cost["canaries"], cost["failed"], round(cost["cpu_ms_per_canary"], 3), cost["p50_ms"]]],
        )
        abs_diffs = [abs(d) for d in diffs]
        report.results = {"jobs": rows, "diff_ms": diffs, "probe_cost": cost}
        report.target(
            "median |client_outage_ms - true 503 window|",
            statistics.median(abs_diffs),
            2 * args.interval * 1000.0,
            "ms",
            why="within two canary intervals",
        )
        report.target("coordinator CPU per canary", cost["cpu_ms_per_canary"], 1.0, "ms")
        report.targets_table()
        report.write()
    finally:
        for process in (coordinator, standin):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
