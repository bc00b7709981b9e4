"""One bench run: a broker (ours or given), a seeded template database, the events produced once,
then every stage in order on its own fresh database and consumer group."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from lapse.devtools.bench import faust_stage, lapse_stage, latency, limits, naive, scans
from lapse.devtools.bench.databases import BenchDatabases, admin_url_for
from lapse.devtools.bench.events import create_topic, produce_events, reservation_event, unique_name
from lapse.devtools.bench.report import summarize
from lapse.devtools.brokers import ApacheKafkaServer
from lapse.kernel.logs import configure_logging
from lapse.kernel.settings import Settings
from lapse.processors import Topics

PARTITIONS = 4
BASELINE_CAP = 3000

T = TypeVar("T")


@dataclass(frozen=True)
class BenchPlan:
    events: int = 20_000
    workers: int = 2
    batch_sizes: tuple[int, ...] = (100, 500, 2000)
    scan_rows: int = 1_000_000
    latency_seconds: float = 5.0
    baseline_cap: int = BASELINE_CAP
    faust: bool = True

    @classmethod
    def quick(cls, events: int = 300, workers: int = 2, batch_sizes: tuple[int, ...] = (100,)) -> BenchPlan:
        """A plan small enough for a smoke test: every stage runs, on a few hundred events."""
        return cls(events, workers, tuple(batch_sizes), scan_rows=20_000, latency_seconds=1.0,
                   baseline_cap=min(events, 200))

    @property
    def default_batch(self) -> int:
        return 500 if 500 in self.batch_sizes else self.batch_sizes[len(self.batch_sizes) // 2]


def own_broker() -> ApacheKafkaServer:
    """An Apache Kafka node from the cached jars in its own temporary folder, which close() deletes."""
    return ApacheKafkaServer(heap="768m").start()


def run_bench(settings: Settings, plan: BenchPlan, progress: Callable[[str], None] = lambda _: None
              ) -> dict[str, Any]:
    """Every stage of the bench; returns one dict with every figure and the ratios."""
    broker = None
    if "bootstrap_servers" not in settings.model_fields_set:
        progress("starting Apache Kafka from the cached jars")
        broker = own_broker()
        settings = settings.model_copy(update={"bootstrap_servers": broker.bootstrap})
    quiet = {} if "log_level" in settings.model_fields_set else {"log_level": "WARNING"}
    settings = settings.model_copy(update={"session_timeout_ms": 6000, **quiet})
    configure_logging(settings)
    try:
        dbs = BenchDatabases(admin_url_for(settings.database.url_plain()))
        try:
            return _stages(settings, plan, dbs, progress)
        finally:
            dbs.close()
    finally:
        if broker is not None:
            broker.close()


def _stages(settings: Settings, plan: BenchPlan, dbs: BenchDatabases, progress: Callable[[str], None]
            ) -> dict[str, Any]:
    n, due = plan.events, datetime.now(UTC) - timedelta(minutes=5)
    progress(f"seeding {n} held reservations and producing {n} expiry events")
    dbs.make_template(n, due)
    events = [reservation_event(rid, due) for rid in range(1, n + 1)]
    topic = unique_name("bench-expiry")
    create_topic(settings, topic, PARTITIONS)
    produce_events(settings, topic, events, datetime.now(UTC))
    topics = Topics(outcomes=settings.topology.outcomes, dlq=settings.topology.dlq)
    out: dict[str, Any] = {"machine": machine(), "run_id": dbs.run_id, "events": n, "partitions": PARTITIONS}

    progress("limit: batch transaction alone, then COPY")
    out["limit"] = [_on_clone(dbs, f"limit{b}", lambda url, b=b: limits.batch_transaction_limit(
        url, events, b, topics)) for b in plan.batch_sizes]
    out["copy"] = _on_clone(dbs, "copy", lambda url: limits.copy_limit(url, events))

    runs = []
    for workers in sorted({1, plan.workers}):
        progress(f"lapse: {workers} worker(s), batch {plan.default_batch}")
        runs.append(_on_clone(dbs, f"lapse{workers}w", lambda url, w=workers: lapse_stage.run_lapse(
            settings, url, topic, n, w, plan.default_batch)))
    for b in plan.batch_sizes:
        if b != plan.default_batch:
            progress(f"lapse: 1 worker, batch {b}")
            runs.append(_on_clone(dbs, f"lapse_b{b}", lambda url, b=b: lapse_stage.run_lapse(
                settings, url, topic, n, 1, b)))
    out["lapse"] = runs

    m = min(n, plan.baseline_cap)
    progress(f"naive consumer on {m} events")
    out["naive"] = _on_clone(dbs, "naive", lambda url: naive.run_naive(settings, url, topic, m))
    if plan.faust:
        progress(f"faust agent on {m} events")
        out["faust"] = _on_clone(dbs, "faust", lambda url: faust_stage.run_faust(settings, url, topic, m))

    one = _lapse_one_worker(out["lapse"], plan.default_batch)
    rate = one["events_per_s"] / 2
    count = max(20, min(n - 1, int(rate * plan.latency_seconds)))
    progress(f"latency at {rate:.0f} events/s offered, {count} events")
    latency_topic = unique_name("bench-latency")
    create_topic(settings, latency_topic, PARTITIONS)
    out["latency"] = _on_clone(dbs, "latency", lambda url: latency.run_latency(
        settings, url, latency_topic, rate, count, plan.default_batch))

    progress(f"reconciler scan over {plan.scan_rows} rows, audit replay of {n} records")
    out["reconciler_scan"] = _on_clone(dbs, "scan", lambda url: scans.reconciler_scan(settings, url, plan.scan_rows))
    out["audit_replay"] = scans.audit_replay(settings, topic)
    return summarize(out, plan.default_batch)


def _on_clone(dbs: BenchDatabases, stage: str, fn: Callable[..., T]) -> T:
    url = dbs.clone(stage)
    try:
        return fn(url)
    finally:
        dbs.drop(url)


def _lapse_one_worker(runs: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    return next(r for r in runs if r["workers"] == 1 and r["batch_size"] == batch)


def machine() -> dict[str, Any]:
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "python": platform.python_version(), "platform": platform.platform()}
