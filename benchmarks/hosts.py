"""Issue 24: the same 4-engine deployment on one test host and on four, side by side in one run.

Test hosts are network namespaces (`tests/support/netns.py`: a control bridge with the coordinator in
the root namespace, a data bridge between the hosts only; needs root). Each layout gets its own
coordinator (runner on, the e2e deadlines) and four `static` agents started by hand: all four in one
host (one control and one data address, as four engines of one machine), or one per host (control
and data on each host's own addresses: every collective and every expert moved crosses the data
bridge). A steady client runs inside each engine's host, sending to that host's engine.

Per layout, `--rounds` times: a 4 -> 3 shrink, then 3 -> 4 back. Figures per job from the job record:
prepare time (the `prepare` phase), the commit window (`downtime_ms`, the engines' own pause union),
and the client-seen outage of the shrink (the longest gap between successful answers covering the
window, over every host's clients). On four hosts, then: time to serving after one host's data link is
cut (from the cut to the first successful answer on the re-formed generation, from the survivors'
clients), and the deployment back at 4 after the link returns (`replace`); and, with
`--coordinator-cut-s` (default 60, 0 to skip), the coordinator cut off from every host: failures its
clients saw in that time, agents that exited, and whether the deployment is as before afterwards.

    sudo .venv/bin/python benchmarks/hosts.py                 # 3 rounds per layout, 60 s coordinator cut
    sudo .venv/bin/python benchmarks/hosts.py --rounds 1 --coordinator-cut-s 0

Target: the commit window across hosts <= 1.5x the window on one host (p50 of the shrinks).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from common import Report, scratch_dir, summarize

from engine_agent import moe
from tests.hosts.cluster import HostAgent, HostClient, HostsCoordinator, start_host_agents
from tests.support.databases import sqlite_database
from tests.support.netns import Host, Hosts, unavailable
from tests.support.stack import ENGINE
from tests.support.waiting import wait_until

TOKENS = torch.randn(6, ENGINE.hidden_size, generator=torch.Generator().manual_seed(7))
EXPECTED = moe.reference_forward(ENGINE, TOKENS).tolist()


@dataclass
class Layout:
    name: str
    hosts: Hosts
    coordinator: HostsCoordinator
    agents: dict[str, HostAgent]

    def members(self) -> list[HostAgent]:
        rows = sorted(
            (e for e in self.coordinator.engines() if e["state"] == "serving"), key=lambda e: e["dp_rank"]
        )
        return [self.agents[e["id"]] for e in rows]

    def clients(self, members: list[HostAgent]) -> list[HostClient]:
        return [
            HostClient([m.url], TOKENS.tolist(), EXPECTED, streams=1, period_s=0.01, host=m.host).start()
            for m in members
        ]

    def scale(self, target: int) -> dict[str, Any]:
        job = self.coordinator.wait_job(self.coordinator.scale(target), timeout_s=180)
        assert job["state"] == "succeeded", job
        return job


@contextmanager
def layout(name: str, host_count: int, work: Path) -> Iterator[Layout]:
    hosts = Hosts.build(host_count)
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    coordinator = HostsCoordinator(sqlite_database(directory, migrated=True), directory / "data")
    agents: list[HostAgent] = []
    try:
        coordinator.start(ready_timeout_s=60.0)
        coordinator.create_deployment("demo", launcher="static", on_engine_loss="replace")
        placement = [(hosts[1 + i % host_count], f"{name}-e{i}") for i in range(4)]
        agents = start_host_agents(hosts, placement, directory, coordinator)
        wait_until(
            lambda: len([e for e in coordinator.engines() if e["state"] == "idle"]) == 4,
            timeout_s=60,
            what="four idle engines",
        )
        made = Layout(name, hosts, coordinator, {a.engine_id: a for a in agents})
        made.scale(4)
        yield made
    finally:
        for agent in agents:
            agent.child.kill()
        coordinator.close()
        hosts.close()


def seconds(phase: dict[str, Any] | None) -> float | None:
    if not phase or not phase.get("started_at") or not phase.get("ended_at"):
        return None
    start = datetime.fromisoformat(phase["started_at"].replace("Z", "+00:00"))
    end = datetime.fromisoformat(phase["ended_at"].replace("Z", "+00:00"))
    return (end - start).total_seconds() * 1000.0


def prepare_ms(job: dict[str, Any]) -> float | None:
    phases = job.get("phases") or {}
    name = next((n for n in phases if n.startswith("prepar")), None)
    return seconds(phases.get(name)) if name else None


def outage_ms(clients: list[HostClient], job: dict[str, Any]) -> float:
    window = job.get("downtime") or {}
    if window.get("window_start") is None:
        return 0.0
    start, end = float(window["window_start"]), float(window["window_end"])
    return max(c.outage_covering(start, end) for c in clients)


def rounds(made: Layout, count: int) -> list[dict[str, Any]]:
    records = []
    for _ in range(count):
        members = made.members()
        clients = made.clients(members[:3])  # the shrink's survivors (leavers are the highest ranks)
        try:
            for c in clients:
                c.wait_serving(count=5)
            shrink = made.scale(3)
            for c in clients:
                c.wait_serving(count=5)
        finally:
            for c in clients:
                c.stop()
        failed = sum(len(c.failures()) for c in clients)
        grow = made.scale(4)
        records.append(
            {
                "shrink_window_ms": shrink["downtime_ms"],
                "shrink_outage_ms": outage_ms(clients, shrink),
                "shrink_prepare_ms": prepare_ms(shrink),
                "grow_prepare_ms": prepare_ms(grow),
                "grow_window_ms": grow["downtime_ms"],
                "client_failures": failed,
            }
        )
        print(f"  {made.name}: {records[-1]}", flush=True)
    return records


def data_cut(made: Layout) -> dict[str, Any]:
    """One host's data link cut while serving: time to serving on the survivors, then whole again."""
    members = made.members()
    cut, survivors = members[-1], members[:-1]
    generation = int(made.coordinator.deployment()["generation"])
    clients = made.clients(survivors)
    try:
        for c in clients:
            c.wait_serving(count=5)
        cut_at = time.time()
        made.hosts.cut(cut.host, "data")
        try:
            wait_until(
                lambda: any(
                    s.ok and s.generation is not None and s.generation > generation
                    for c in clients
                    for s in c.samples
                ),
                timeout_s=120,
                what="the survivors serving a new generation",
            )
            served_again = min(
                s.done_at
                for c in clients
                for s in list(c.samples)
                if s.ok and s.generation is not None and s.generation > generation
            )
            fenced = made.coordinator.engines()
        finally:
            made.hosts.mend(cut.host, "data")
        mended_at = time.time()
        wait_until(
            lambda: made.coordinator.deployment()["current_dp_size"] == 4 and len(made.members()) == 4,
            timeout_s=180,
            what="replace to grow back to 4",
        )
        whole_at = time.time()
    finally:
        for c in clients:
            c.stop()
    states = {e["id"]: e["state"] for e in fenced}
    return {
        "time_to_serving_ms": (served_again - cut_at) * 1000.0,
        "cut_engine_state": states.get(cut.engine_id),
        "whole_again_after_mend_ms": (whole_at - mended_at) * 1000.0,
    }


def coordinator_cut(made: Layout, cut_s: float) -> dict[str, Any]:
    before = made.coordinator.deployment()
    members = made.members()
    clients = made.clients(members)
    try:
        for c in clients:
            c.wait_serving(count=5)
        start = time.time()
        all_hosts: list[Host] = made.hosts.hosts
        with made.hosts.cut_off(all_hosts, "control"):
            time.sleep(cut_s)
            during = made.coordinator.deployment()
            exited = [a.engine_id for a in made.agents.values() if not a.child.alive()]
        end = time.time()
        for c in clients:
            c.wait_serving(count=5)
    finally:
        for c in clients:
            c.stop()
    failures = sum(1 for c in clients for s in c.failures() if start <= s.sent_at <= end + 1)
    successes = sum(c.successes_between(start, end) for c in clients)
    wait_until(
        lambda: made.coordinator.deployment()["conditions"] == [], timeout_s=60, what="conditions cleared"
    )
    after = made.coordinator.deployment()
    return {
        "cut_s": cut_s,
        "client_successes_during_cut": successes,
        "client_failures_during_cut": failures,
        "agents_exited": exited,
        "conditions_during_cut": len(during["conditions"]),
        "status_during_cut": during["status"],
        "generation_unchanged": after["generation"] == before["generation"] and after["status"] == "ready",
    }


def p50(records: list[dict[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in records if r.get(key) is not None]
    return summarize(values)["p50"] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--coordinator-cut-s", type=float, default=60.0)
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        raise SystemExit(f"no test hosts here: {reason}")
    report = Report("hosts")
    report.parameters = {"rounds": args.rounds, "engines": 4, "coordinator_cut_s": args.coordinator_cut_s}
    work = scratch_dir("hosts")
    results: dict[str, Any] = {}
    with layout("one", 1, work) as one:
        results["one_host"] = {"rounds": rounds(one, args.rounds)}
    with layout("four", 4, work) as four:
        results["four_hosts"] = {"rounds": rounds(four, args.rounds)}
        results["four_hosts"]["data_cut"] = data_cut(four)
        print(f"  data cut: {results['four_hosts']['data_cut']}", flush=True)
        if args.coordinator_cut_s > 0:
            results["four_hosts"]["coordinator_cut"] = coordinator_cut(four, args.coordinator_cut_s)
            print(f"  coordinator cut: {results['four_hosts']['coordinator_cut']}", flush=True)
    report.results = results
    one_r, four_r = results["one_host"]["rounds"], results["four_hosts"]["rounds"]
    rows = []
    for key, label in (
        ("shrink_prepare_ms", "prepare, 4 -> 3 (ms)"),
        ("grow_prepare_ms", "prepare, 3 -> 4 (ms)"),
        ("shrink_window_ms", "commit window, 4 -> 3 (ms)"),
        ("grow_window_ms", "commit window, 3 -> 4 (ms)"),
        ("shrink_outage_ms", "client-seen outage, 4 -> 3 (ms)"),
    ):
        a, b = p50(one_r, key), p50(four_r, key)
        rows.append([label, a, b, b / a if a else float("nan")])
    report.add_table(
        "p50 over the rounds: one host against four", ["figure", "1 host", "4 hosts", "ratio"], rows
    )
    cut = results["four_hosts"]["data_cut"]
    later = [
        ["data link cut: time to serving (ms)", cut["time_to_serving_ms"]],
        ["data link cut: the cut engine's state", cut["cut_engine_state"]],
        ["data link back: whole again after (ms)", cut["whole_again_after_mend_ms"]],
    ]
    if "coordinator_cut" in results["four_hosts"]:
        cc = results["four_hosts"]["coordinator_cut"]
        later += [
            [f"coordinator cut {cc['cut_s']:g} s: client successes", cc["client_successes_during_cut"]],
            [f"coordinator cut {cc['cut_s']:g} s: client failures", cc["client_failures_during_cut"]],
            ["coordinator cut: agents exited", len(cc["agents_exited"])],
            ["coordinator cut: same generation, ready after", cc["generation_unchanged"]],
        ]
    report.add_table("Four hosts: network faults", ["figure", "value"], later)
    ratio = p50(four_r, "shrink_window_ms") / p50(one_r, "shrink_window_ms")
    results["window_ratio"] = ratio
    report.target(
        "commit window across 4 hosts / on 1 host (4 -> 3, p50)",
        ratio,
        1.5,
        "x",
        why="the window's collectives and the new groups cross the data bridge",
    )
    if "coordinator_cut" in results["four_hosts"]:
        cc = results["four_hosts"]["coordinator_cut"]
        report.target("client failures while the coordinator is cut off", cc["client_failures_during_cut"], 0)
        report.target("agents that exited while the coordinator is cut off", len(cc["agents_exited"]), 0)
    report.notes.append(
        "Test hosts are network namespaces on one machine (veth pairs over Linux bridges): no real NIC "
        "latency or bandwidth, so the ratio shows what crossing hosts costs in the product's own code "
        "(addresses, binds, the data network's TCP), not a real fabric."
    )
    report.targets_table()
    report.write()


if __name__ == "__main__":
    main()
