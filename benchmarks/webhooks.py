"""Outbound webhook throughput: ordered delivery (the default: one delivery in flight per subscription,
oldest event first) against parallel delivery (`EPCTL_WEBHOOK_ORDERED=false`).

The coordinator's own delivery worker (`app.webhooks.delivery.DeliveryWorker`, dispatch included:
sequence numbers, the claim's compare-and-set, the attempt log) sends N outbox events to a local
receiver that verifies every signature with the reference `standardwebhooks` library
(tests/operators/receiver.py), on a SQLite file. Each mode runs on a fresh database, in alternating
order over the rounds, so the ratio is not skewed by load other processes put on the machine.

    .venv/bin/python benchmarks/webhooks.py                  # 200 events, 1 and 4 subscriptions, 3 rounds
    .venv/bin/python benchmarks/webhooks.py --events 50 --rounds 1

Targets (ratios within one run: the machine is small and shared): ordered delivery to one subscription
keeps at least half the rate of parallel delivery (per-delivery database work dominates, not the wait
for the previous answer), and every ordered event arrives in sequence order. The absolute rate is
reported beside: a reconfiguration emits about five events.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from common import Report, scratch_dir, summarize
from sqlmodel import Session, col, func, select

from app.core.db import make_engine, migrate_to_head
from app.core.ids import new_id
from app.webhooks import service
from app.webhooks.delivery import DeliveryPolicy, DeliveryWorker
from app.webhooks.models import OUTBOX_ID_PREFIX, DeliveryState, OutboxEvent, WebhookDelivery
from tests.operators.receiver import LOOPBACK, WebhookReceiver


def one_run(events: int, subscriptions: int, ordered: bool, tag: str) -> dict[str, Any]:
    path = scratch_dir("webhooks") / f"{tag}.db"
    path.unlink(missing_ok=True)
    url = f"sqlite:///{path}"
    migrate_to_head(url)
    engine = make_engine(url)
    receivers = [WebhookReceiver() for _ in range(subscriptions)]
    contexts = [r.running() for r in receivers]
    for context in contexts:
        context.__enter__()
    try:
        with Session(engine) as session:
            for receiver in receivers:
                created = service.create_subscription(session, service.WebhookCreate(url=receiver.url))
                receiver.secret = created.secret
            for index in range(events):
                session.add(
                    OutboxEvent(
                        id=new_id(OUTBOX_ID_PREFIX),
                        type="reconfiguration.phase_changed",
                        deployment_id="dep_bench",
                        payload={
                            "type": "reconfiguration.phase_changed",
                            "timestamp": "now",
                            "data": {"i": index},
                        },
                    )
                )
            session.commit()
        policy = DeliveryPolicy(
            poll_s=0.0,
            retry_base_s=0.01,
            retry_max_s=0.05,
            ordered=ordered,
            dispatch_batch=500,
            allow_networks=LOOPBACK,  # the receivers listen on loopback (app/core/targets.py)
        )
        worker = DeliveryWorker(engine, policy)

        def pending() -> int:
            with Session(engine) as session:
                statement = select(func.count()).select_from(WebhookDelivery)
                statement = statement.where(col(WebhookDelivery.state) == DeliveryState.pending.value)
                return int(session.exec(statement).one())

        started = time.perf_counter()

        async def drain() -> None:
            # The worker as the coordinator runs it (one HTTP client for its life), until all is sent.
            task = asyncio.create_task(worker.run_forever())
            try:
                while await asyncio.to_thread(pending) or not dispatched_all():
                    await asyncio.sleep(0.01)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        def dispatched_all() -> bool:
            with Session(engine) as session:
                statement = select(func.count()).select_from(OutboxEvent)
                statement = statement.where(col(OutboxEvent.dispatched_at).is_(None))
                return int(session.exec(statement).one()) == 0

        asyncio.run(drain())
        elapsed = time.perf_counter() - started
        in_order = all(
            [p["data"]["sequence"] for p in r.processed.values()] == list(range(1, events + 1))
            for r in receivers
        )
        verified = all(req.signature_valid for r in receivers for req in r.requests)
        delivered = sum(len(r.processed) for r in receivers)
        return {
            "elapsed_s": elapsed,
            "deliveries": delivered,
            "deliveries_per_s": delivered / elapsed,
            "per_subscription_per_s": delivered / elapsed / subscriptions,
            "in_order": in_order,
            "all_verified": verified,
        }
    finally:
        for context in contexts:
            context.__exit__(None, None, None)
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--subscriptions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    report = Report("webhooks")
    report.parameters = vars(args)
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for round_index in range(args.rounds):
        modes = [True, False] if round_index % 2 == 0 else [False, True]
        for subscriptions in args.subscriptions:
            for ordered in modes:
                tag = f"{'ordered' if ordered else 'parallel'}-{subscriptions}-{round_index}"
                runs.setdefault((subscriptions, ordered), []).append(
                    one_run(args.events, subscriptions, ordered, tag)
                )
    rows = []
    for (subscriptions, ordered), results in sorted(runs.items()):
        rate = summarize([r["per_subscription_per_s"] for r in results])
        rows.append(
            [
                subscriptions,
                "ordered" if ordered else "parallel",
                rate["p50"],
                rate["min"],
                all(r["in_order"] for r in results),
                all(r["all_verified"] for r in results),
            ]
        )
        report.results[f"{'ordered' if ordered else 'parallel'}_{subscriptions}"] = {
            "per_subscription_events_per_s": rate,
            "in_order": all(r["in_order"] for r in results),
            "all_verified": all(r["all_verified"] for r in results),
        }
    report.add_table(
        f"Webhook deliveries ({args.events} events per subscription, {args.rounds} rounds)",
        [
            "subscriptions",
            "mode",
            "events/s per subscription (p50)",
            "min",
            "in sequence order",
            "all verified",
        ],
        rows,
    )
    ordered_one = report.results["ordered_1"]["per_subscription_events_per_s"]["p50"]
    parallel_one = report.results["parallel_1"]["per_subscription_events_per_s"]["p50"]
    report.results["ratio_ordered_over_parallel_1"] = round(ordered_one / parallel_one, 3)
    report.target(
        "ordered / parallel delivery rate, one subscription (p50)",
        ordered_one / parallel_one,
        0.5,
        at_least=True,
        why=f"ordered {ordered_one:.1f} events/s, parallel {parallel_one:.1f} events/s",
    )
    report.target(
        "ordered deliveries arrive in sequence order",
        float(all(v["in_order"] for k, v in report.results.items() if k.startswith("ordered"))),
        1.0,
        at_least=True,
    )
    report.targets_table()
    report.write()


if __name__ == "__main__":
    main()
