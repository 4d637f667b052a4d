"""The tables, targets and figure of `gpu.py`: per `--cuda-graphs` value, the agent's serving and its
1 -> 1 reconfigurations; the engine's step per token count beside the bare compute."""

from __future__ import annotations

import argparse
from typing import Any

from common import Report, new_figure, save_figure, summarize

PARTS = ("boundary_wait_ms", "warmup_ms", "capture_ms", "blocking_prepare_ms", "switch_ms", "resume_ms")
COMBOS = [(s, p) for s in ("background", "armed", "blocking") for p in ("eager", "deferred")]


def agent_tables(report: Report, args: argparse.Namespace, by_mode: dict[str, Any], device: str) -> None:
    report.add_table(
        "Serving on the agent (binary and JSON /v1/infer, HTTP included)",
        ["cuda graphs", "infer tokens", "binary p50 ms", "binary p99 ms", "JSON p50 ms", "steps served",
         "formation prepare ms"],
        [[mode, d["serving"]["infer_tokens"], d["serving"]["infer_binary_latency_ms"]["p50"],
          d["serving"]["infer_binary_latency_ms"]["p99"], d["serving"]["infer_latency_ms"]["p50"],
          d["serving"]["serving_steps"], d["formation"]["prepare_ms"]] for mode, d in by_mode.items()],
    )  # fmt: skip
    rows = []
    for mode, driven in by_mode.items():
        for strategy, policy in COMBOS:
            jobs = [j for j in driven["jobs"] if j["strategy"] == strategy and j["policy"] == policy]
            window = summarize([j["commit_window_ms"] for j in jobs if j["commit_window_ms"] is not None])
            parts = [summarize([j["pause"].get(key, 0.0) for j in jobs]).get("p50") for key in PARTS]
            prepare = summarize([j["prepare_ms"] for j in jobs]).get("p50")
            captured = [j["graphs"] for j in jobs if j.get("graphs")]
            capture = summarize([g["capture_ms"] for g in captured]).get("p50") if captured else None
            memory = round(captured[-1]["graph_bytes"] / 2**20, 1) if captured else None
            where = ("window" if captured[-1]["in_window"] else "prepare") if captured else "-"
            rows.append(
                [mode, strategy, policy, prepare, window.get("p50"), window.get("max"), *parts, where,
                 capture, memory]
            )  # fmt: skip
    report.add_table(
        f"1 -> 1 reconfiguration on {device} ({args.reps} reps; ms, p50 unless max)",
        ["cuda graphs", "strategy", "policy", "prepare", "commit window", "window max", "boundary wait",
         "warm-up", "graph capture (window)", "blocking prepare", "switch", "resume", "captured in",
         "capture ms", "graph MiB"],
        rows,
    )  # fmt: skip
    report.results["reconfig_rows"] = rows
    last_mode, last = list(by_mode.items())[-1]
    report.target(
        f"/v1/infer of {last['serving']['infer_tokens']} tokens, binary body, p50 (graphs {last_mode})",
        last["serving"]["infer_binary_latency_ms"]["p50"],
        3.0,
        "ms",
    )
    for strategy, label, limit in (
        ("armed", "engine-agreed (background's default)", 1.0),
        ("background", "coordinator pause + switch", 1.0),
    ):
        eager = [r for r in rows if r[0] == last_mode and r[1] == strategy and r[2] == "eager"]
        if eager and eager[0][4] is not None:
            report.target(
                f"commit window p50, {label}, eager (graphs {last_mode}): one step plus the switch",
                float(eager[0][4]),
                limit,
                "ms",
            )


def step_tables(
    report: Report, args: argparse.Namespace, step: dict[str, Any], by_mode: dict[str, Any]
) -> None:
    bare = step["bare"]
    modes = [m for m in args.cuda_graphs if m in step]
    rows = []
    for size in args.step_sizes:
        anchor = bare[size]
        row: list[Any] = [size, anchor["experts_touched"], anchor["eager_ms"], anchor["graph_ms"]]
        for mode in modes:
            p50 = step[mode]["steps_ms"][size]["p50"]
            row += [p50, round(p50 / anchor["graph_ms"], 2)]
        rows.append(row)
    headers = ["tokens", "experts touched", "bare compute eager ms", "bare compute graph ms"]
    for mode in modes:
        headers += [f"engine step p50 ms (graphs {mode})", f"x bare (graphs {mode})"]
    report.add_table("The engine's step (one request at a time) against the bare compute of the same work",
                     headers, rows)  # fmt: skip
    captured = [(m, step[m]) for m in modes if "capture_ms" in step[m]]
    if captured:
        report.add_table(
            f"Step graphs of one generation (buckets {args.graph_buckets}, in-process engine)",
            ["cuda graphs", "graphs", "capture ms", "graph MiB (pool + inputs)", "allocated growth MiB"],
            [[m, s["graph_count"], s["capture_ms"], round(s["graph_bytes"] / 2**20, 1),
              round(s["allocated_growth_bytes"] / 2**20, 1)] for m, s in captured],
        )  # fmt: skip
    best = modes[-1]
    if 64 in step[best]["steps_ms"] and 64 in bare:
        report.target(
            f"engine step of 64 tokens (graphs {best}) / bare compute of the same work (graph replay)",
            step[best]["steps_ms"][64]["p50"] / bare[64]["graph_ms"],
            2.0,
            "x",
        )


def window_figure(report: Report, by_mode: dict[str, Any], device: str) -> None:
    rows = report.results["reconfig_rows"]
    fig, (ax,) = new_figure(width=9)
    labels = [f"{r[1]}\n{r[2]}\n{r[0]}" for r in rows]
    ax.bar(range(len(rows)), [r[4] or 0 for r in rows], label="commit window p50")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(f"Commit window on {report.machine.get('gpu', device)} (world 1), graphs off / on")
    ax.legend(fontsize=8)
    save_figure(fig, report.name)
