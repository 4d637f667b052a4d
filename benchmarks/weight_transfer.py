"""Item 7: weight transfer in prepare, through the product's channel (NIXL) against gloo and a memory copy.

Two processes, a holder and a receiver, open the product's weight channel (`engine_agent.transfer`)
exactly as prepare does, once per backend, and move the same expert weights (the size split into
`--experts` experts, each a view of one slab, as an engine holds them) from the holder to the
receiver. Each round runs every backend back to back (order rotated per round), both workers
starting each transfer together, and then the receiver times an in-process `torch` copy_ of the same
bytes: the machine's memory-bandwidth limit. The ratios are medians of the per-round ratios, so a
busy neighbour slows all three alike. The last round of each backend is checked byte for byte.

    .venv/bin/python benchmarks/weight_transfer.py                        # 64, 256 and 1024 MiB
    .venv/bin/python benchmarks/weight_transfer.py --mib 64 256 --repeats 5 \
        --out benchmarks/results/weight_transfer.json          # .md and .png are written beside it

Throughput is bytes / the receiver's `transfer()` wall time, which includes what the channel does per
transfer: for NIXL the memory registration and descriptor exchange through the store, for gloo the
send/recv posting. `--device cuda` moves device memory (NIXL registers VRAM; gloo stages via host).
Targets: NIXL >= 5x gloo and >= 30% of the memory copy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from common import PYTHON, RESULTS_DIR, ROOT, Report, new_figure

from engine_agent.placement import TransferItem
from engine_agent.protocol import TransferBackend
from engine_agent.transfer import WeightChannel, available_backends, nixl_unavailable_reason, open_channel

GIB = float(1 << 30)
MIB = 1 << 20
ROLES = ("holder", "receiver")
RESULT_KEY = "bench/result"
TIMEOUT_S = 120.0


def expert_numels(mib: int, experts: int) -> list[int]:
    """Split `mib` MiB of float32 into `experts` experts (the last takes the remainder)."""
    total = mib * MIB // 4
    base = total // experts
    return [base] * (experts - 1) + [total - base * (experts - 1)]


def fill_expected(slab: torch.Tensor, numels: Sequence[int]) -> None:
    """What the holder holds: distinct, cheap to regenerate, every byte position meaningful."""
    offset = 0
    for expert, numel in enumerate(numels):
        view = slab[offset : offset + numel]
        torch.arange(numel, out=view)
        view.mul_(1.0001).add_(expert * 7.5)
        offset += numel


def expert_views(slab: torch.Tensor, numels: Sequence[int]) -> dict[int, torch.Tensor]:
    views, offset = {}, 0
    for expert, numel in enumerate(numels):
        views[expert] = slab[offset : offset + numel]
        offset += numel
    return views


# ---------------------------------------------------------------------------------------------------
# worker side (one holder, one receiver)


def run_worker(args: argparse.Namespace) -> None:
    """Open every backend's channel, then per size and repeat run each backend once (order rotated
    per repeat), so that the backends and the memory copy are compared under the same load."""
    device = torch.device(args.device)
    store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=TIMEOUT_S))
    channels: dict[str, WeightChannel] = {}
    open_s: dict[str, float] = {}
    sizes: dict[str, Any] = {}
    try:
        for backend in args.backends:
            opened = time.perf_counter()
            channels[backend] = open_channel(
                TransferBackend(backend),
                engine_id=args.worker,
                participants=list(ROLES),
                store=dist.PrefixStore(f"bench/{backend}", store),
                device=device,
                timeout_s=TIMEOUT_S,
            )
            open_s[backend] = time.perf_counter() - opened
        barrier_round = 0
        for mib in args.mib:
            numels = expert_numels(mib, args.experts)
            plan = [TransferItem(e, "holder", "receiver") for e in range(len(numels))]
            slab = torch.zeros(sum(numels), dtype=torch.float32, device=device)  # touched up front
            copy_source = torch.empty(0)
            if args.worker == "holder":
                fill_expected(slab, numels)
                sources, destinations = expert_views(slab, numels), {}
            else:
                sources, destinations = {}, expert_views(slab, numels)
                copy_source = torch.rand(slab.numel(), device=device)
            seconds: dict[str, list[float]] = {b: [] for b in [*args.backends, "memory_copy"]}
            exact: dict[str, bool] = {}
            for repeat in range(args.repeats + 1):  # repeat 0 warms up and is reported apart
                order = (
                    args.backends[repeat % len(args.backends) :]
                    + args.backends[: repeat % len(args.backends)]
                )
                for backend in order:
                    if args.worker == "receiver":
                        slab.zero_()
                    synchronize(device)
                    barrier(store, f"barrier/{barrier_round}")
                    barrier_round += 1
                    stats = channels[backend].transfer(plan, sources, destinations)
                    synchronize(device)
                    seconds[backend].append(stats.seconds)
                    if args.worker == "receiver" and repeat == args.repeats:
                        exact[backend] = bool(torch.equal(slab, expected_slab(numels, device)))
                if args.worker == "receiver":
                    synchronize(device)
                    started = time.perf_counter()
                    slab.copy_(copy_source)
                    synchronize(device)
                    seconds["memory_copy"].append(time.perf_counter() - started)
            sizes[str(mib)] = {"bytes": mib * MIB, "seconds": seconds, "exact": exact}
            del slab, sources, destinations, copy_source
    finally:
        for channel in channels.values():
            channel.close()
    if args.worker == "receiver":
        store.set(RESULT_KEY, json.dumps({"open_s": open_s, "sizes": sizes}))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(store: dist.Store, key: str) -> None:
    """Both workers start each timed transfer together, so neither measures the other's lateness."""
    store.add(key, 1)
    deadline = time.monotonic() + TIMEOUT_S
    while int(store.add(key, 0)) < len(ROLES):
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {key}: the other worker never came")
        time.sleep(0.0005)


def expected_slab(numels: Sequence[int], device: torch.device) -> torch.Tensor:
    expected = torch.empty(sum(numels), dtype=torch.float32, device=device)
    fill_expected(expected, numels)
    return expected


# ---------------------------------------------------------------------------------------------------
# parent side


def run_pair(args: argparse.Namespace, backends: list[str]) -> dict[str, Any]:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT_S)
    )
    argv_common = [
        "--port", str(store.port),
        "--device", args.device,
        "--experts", str(args.experts),
        "--repeats", str(args.repeats),
        "--mib", *map(str, args.mib),
        "--backends", *backends,
    ]  # fmt: skip
    log_dir = RESULTS_DIR / "tmp"
    log_dir.mkdir(parents=True, exist_ok=True)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for role in ROLES:
            with (log_dir / f"weight_transfer-{role}.log").open("wb") as log:
                workers.append(
                    subprocess.Popen(
                        [PYTHON, str(Path(__file__).resolve()), "--worker", role, *argv_common],
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + 600
        while not store.check([RESULT_KEY]):
            failed = [w for w in workers if w.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                logs = "\n".join(
                    (log_dir / f"weight_transfer-{r}.log").read_text(errors="replace")[-3000:] for r in ROLES
                )
                raise RuntimeError(f"a transfer worker failed or hung:\n{logs}")
            time.sleep(0.1)
        result: dict[str, Any] = json.loads(store.get(RESULT_KEY))
        for worker in workers:
            worker.wait(timeout=60)
        return result
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def gib_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / GIB


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, nargs="+", default=[64, 256, 1024], help="sizes to move, MiB")
    parser.add_argument("--experts", type=int, default=8, help="experts the bytes are split into")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per size (after 1 warm-up)")
    parser.add_argument("--device", default="cpu", help="cpu (host memory) or cuda (device memory)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR / "weight_transfer.json", help="JSON; .md and .png beside it"
    )
    parser.add_argument("--redraw", action="store_true", help="only redraw the PNG from the --out JSON")
    parser.add_argument("--worker", choices=ROLES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--backends", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return
    if args.redraw:
        saved = json.loads(args.out.read_text())
        sizes = {int(mib): entry for mib, entry in saved["results"]["sizes"].items()}
        parameters = saved["parameters"]
        draw(sizes, parameters["backends"], parameters["device"], args.out.with_suffix(".png"))
        return

    have = available_backends()
    if TransferBackend.nixl not in have:
        print(f"NIXL is unavailable ({nixl_unavailable_reason()}): measuring gloo and the copy only")
    backends = [b.value for b in (TransferBackend.nixl, TransferBackend.gloo) if b in have]
    report = Report("weight_transfer")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    report.notes = [
        f"Measured on a host with {os.cpu_count()} CPU cores, load average {load:.1f} at the start: other"
        " work on the host slows every backend; quote the ratios, taken round by round within one run."
    ]
    report.parameters = {
        "mib": args.mib,
        "experts": args.experts,
        "repeats": args.repeats,
        "device": args.device,
        "torch": torch.__version__,
        "backends": backends,
        "ucx_tls": os.environ.get("UCX_TLS", "(UCX default)"),
    }
    measured = run_pair(args, backends)
    sizes = {mib: summarize_size(mib, measured["sizes"][str(mib)], backends) for mib in args.mib}
    report.results = {"open_s": measured["open_s"], "sizes": {str(m): e for m, e in sizes.items()}}

    report.add_table(
        f"Weight transfer holder -> receiver ({args.device}, {args.experts} experts, "
        f"median of {args.repeats} paired rounds)",
        ["MiB", "memory copy GiB/s", "NIXL GiB/s", "gloo GiB/s", "NIXL / gloo", "NIXL / copy", "bytes exact"],
        [
            [
                mib,
                e["memory_copy"]["gib_s"],
                e.get("nixl", {}).get("gib_s", float("nan")),
                e.get("gloo", {}).get("gib_s", float("nan")),
                e.get("nixl_over_gloo", float("nan")),
                e.get("nixl_over_memory_copy", float("nan")),
                " ".join(f"{b}:{'yes' if e[b]['exact'] else 'NO'}" for b in backends),
            ]
            for mib, e in sizes.items()
        ],
    )
    report.add_table(
        "Channel set-up (in prepare, once per reconfiguration) and the first (warm-up) transfer, s",
        ["backend", "open", *[f"first transfer {mib} MiB" for mib in args.mib]],
        [[b, measured["open_s"][b], *[sizes[mib][b]["first_s"] for mib in args.mib]] for b in backends],
    )
    target_rows = []
    for mib, entry in sizes.items():
        for name, key, limit in (
            ("NIXL / gloo", "nixl_over_gloo", 5.0),
            ("NIXL / memory copy", "nixl_over_memory_copy", 0.30),
        ):
            if key not in entry:
                continue
            met = entry[key] >= limit
            report.targets.append(
                {"target": f"{name} at {mib} MiB", "measured": round(entry[key], 3), "limit": limit,
                 "comparison": ">=", "unit": "x", "met": met}
            )  # fmt: skip
            target_rows.append(
                [f"{name} at {mib} MiB", f"{entry[key]:.2f} x", f">= {limit:g}", "met" if met else "MISSED"]
            )
    report.add_table(
        "Targets", ["target", "measured (median of paired ratios)", "limit", "verdict"], target_rows
    )
    if not all(entry[b]["exact"] for entry in sizes.values() for b in backends):
        report.notes.append("A transfer did NOT deliver the exact bytes: the figures above are void.")
    report.notes.append(
        "Each round runs NIXL, gloo and the copy back to back (backend order rotated per round) and the"
        " ratios are the medians of the per-round ratios, so a busy neighbour slows all three alike."
        " Throughput = bytes / the receiver's transfer() wall time, which includes the channel's per-transfer"
        " work (NIXL: memory registration and descriptor exchange through the store)."
    )
    write_report(report, args.out)
    draw(sizes, backends, args.device, args.out.with_suffix(".png"))


def summarize_size(mib: int, measured: dict[str, Any], backends: Sequence[str]) -> dict[str, Any]:
    nbytes = mib * MIB
    rounds = measured["seconds"]
    copy_s = rounds["memory_copy"][1:]
    entry: dict[str, Any] = {
        "bytes": nbytes,
        "memory_copy": {"gib_s": gib_per_s(nbytes, statistics.median(copy_s)), "seconds": copy_s},
    }
    for backend in backends:
        timed = rounds[backend][1:]
        entry[backend] = {
            "gib_s": gib_per_s(nbytes, statistics.median(timed)),
            "seconds": timed,
            "first_s": rounds[backend][0],
            "exact": measured["exact"][backend],
        }
    if "nixl" in entry:
        nixl_s = rounds["nixl"][1:]
        entry["nixl_over_memory_copy"] = statistics.median(c / n for c, n in zip(copy_s, nixl_s, strict=True))
        if "gloo" in entry:
            gloo_s = rounds["gloo"][1:]
            entry["nixl_over_gloo"] = statistics.median(g / n for g, n in zip(gloo_s, nixl_s, strict=True))
    return entry


def write_report(report: Report, out: Path) -> None:
    """Report.write() always writes benchmarks/results/<name>.*; honour --out instead."""
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": report.name,
        "command": report.command,
        "started_at": report.started_at,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": report.machine,
        "parameters": report.parameters,
        "results": report.results,
        "targets": report.targets,
        "notes": report.notes,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    markdown = out.with_suffix(".md")
    markdown.write_text(
        f"<!-- generated by: {report.command} at {report.started_at} -->\n\n"
        + "\n".join(report.tables)
        + "\n"
        + "\n".join(f"- {note}" for note in report.notes)
        + "\n"
    )
    print(f"wrote {out} and {markdown}")


def draw(sizes: dict[int, Any], backends: Sequence[str], device: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = new_figure()
    ax = axes[0]
    series = [("memory copy (in-process)", "memory_copy")] + [
        (f"{'NIXL' if b == 'nixl' else 'gloo'} channel", b) for b in backends
    ]
    width = 0.8 / len(series)
    mibs = list(sizes)
    for i, (label, key) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(mibs))]
        bars = ax.bar(xs, [sizes[mib][key]["gib_s"] for mib in mibs], width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(len(mibs)), [f"{mib} MiB" for mib in mibs])
    values = [sizes[mib][key]["gib_s"] for mib in mibs for _, key in series]
    if max(values) > 100 * min(values):  # device memory: the copy is 1000x the rest
        ax.set_yscale("log")
        ax.set_ylim(top=max(values) * 20)
        ax.set_ylabel("GiB/s (log scale)")
    else:
        ax.set_ylim(top=max(values) * 1.35)
        ax.set_ylabel("GiB/s")
    ax.set_title(f"Expert weight transfer, two processes, one host ({device})")
    ax.legend(loc="upper left", ncols=len(series), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
