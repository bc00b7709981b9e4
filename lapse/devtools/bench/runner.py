"""One bench run: a broker (ours or given), a seeded template database, then every stage in order
in its own environment (topic prefix, database clone, expiry topic with its events).

Every cleanup stage (Lapse's and the baselines') has its end state checked in its database
before its figure counts (lapse.devtools.bench.end_state); a stage that fails, or fails the
check, is reported with `verified: false` and its reason, its ratio is null, and the run goes on
(only the latency stage needs the one-worker Lapse run's rate)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from lapse.devtools.bench import (
    bound,
    console_pages,
    fairness,
    faust_stage,
    lapse_stage,
    latency,
    limits,
    naive,
    quix_stage,
    relay_stage,
    scans,
)
from lapse.devtools.bench.databases import BenchDatabases, admin_url_for
from lapse.devtools.bench.end_state import verify_end_state
from lapse.devtools.bench.environments import StageEnvironments
from lapse.devtools.bench.events import reservation_event
from lapse.devtools.bench.ledger_watch import StageFailed
from lapse.devtools.bench.report import summarize
from lapse.devtools.brokers import ApacheKafkaServer
from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.logs import configure_logging, get_logger
from lapse.kernel.settings import Settings

log = get_logger("bench")

PARTITIONS = 4
LATENCY_WARMUP_S = 2.0  # of load at the latency stage's rate before its measured events
BASELINE_CAP = 3000
# The stages whose rates make the ratios (the bound, the batch transaction, one Lapse worker, the
# workers side by side, the peer) each run this many times and count their fastest verified run,
# every run's rate kept: on this kind of machine one busy minute moves a run by more than the
# differences measured.
BEST_OF = 2

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
    console_rows: int = 2_000_000
    quix_python: Path = quix_stage.DEFAULT_PYTHON  # the Python of the Quix Streams peer's environment
    fairness_backlog: int = 100_000
    fairness_repeats: int = 3
    best_of: int = BEST_OF

    @classmethod
    def quick(cls, events: int = 300, workers: int = 2, batch_sizes: tuple[int, ...] = (100,)) -> BenchPlan:
        """A plan small enough for a smoke test: every stage runs, on a few hundred events."""
        return cls(events, workers, tuple(batch_sizes), scan_rows=20_000, latency_seconds=1.0,
                   baseline_cap=min(events, 200), console_rows=20_000, fairness_backlog=1000, fairness_repeats=1,
                   best_of=1)

    @property
    def default_batch(self) -> int:
        return 500 if 500 in self.batch_sizes else self.batch_sizes[len(self.batch_sizes) // 2]


def own_broker(settings: Settings) -> ApacheKafkaServer:
    """An Apache Kafka node from the cached jars in its own temporary folder, which close() deletes."""
    return ApacheKafkaServer(heap="768m", jars_dir=settings.dev.kafka_jars,
                             java_home=settings.dev.java_home).start()


@contextmanager
def given_or_own_broker(settings: Settings, progress: Callable[[str], None]) -> Iterator[Settings]:
    """`settings` on the broker the flags or the environment gave, else on an Apache Kafka of our
    own from the cached jars, closed afterwards. Ask before `with_()`, which marks every field set."""
    if "bootstrap_servers" in settings.kafka.model_fields_set:
        yield settings
        return
    progress("starting Apache Kafka from the cached jars")
    broker = own_broker(settings)
    try:
        yield settings.with_(kafka={"bootstrap_servers": broker.bootstrap})
    finally:
        broker.close()


def run_bench(settings: Settings, plan: BenchPlan, progress: Callable[[str], None] = lambda _: None
              ) -> dict[str, Any]:
    """Every stage of the bench; returns one dict with every figure and the ratios."""
    # What the flags and the environment set, asked before with_(), which marks every field set.
    quiet = {} if "log_level" in settings.runtime.model_fields_set else {"log_level": "WARNING"}
    with given_or_own_broker(settings, progress) as settings:
        # The bench cleans up the demo's reservations: the demo's kinds (release-reservation only).
        settings = settings.with_(processor={"session_timeout_ms": 6000}, runtime=quiet,
                                  kinds={"file": packaged_kinds_file()})
        configure_logging(settings)
        dbs = BenchDatabases(admin_url_for(settings.database.url_plain()))
        envs = StageEnvironments(settings, dbs, PARTITIONS)
        try:
            return _stages(envs, plan, progress)
        finally:
            envs.close()
            dbs.close()


def _stages(envs: StageEnvironments, plan: BenchPlan, progress: Callable[[str], None]) -> dict[str, Any]:
    n, due = plan.events, datetime.now(UTC) - timedelta(minutes=5)
    progress(f"seeding {n} held reservations; each stage gets its own expiry topic and events")
    envs.dbs.make_template(n, due)
    events = [reservation_event(rid, due) for rid in range(1, n + 1)]
    out: dict[str, Any] = {"machine": machine(), "run_id": envs.dbs.run_id, "events": n,
                           "partitions": PARTITIONS}

    progress("the limit: the consumer alone (no database), the database's lower bound (no Kafka)")
    out["consumer"] = _in(envs, "consumer", lambda s: limits.consumer_limit(s, n), events=events,
                          batch_size=plan.default_batch)
    out["decode"] = limits.decode_cost(envs.settings("decode"), events)
    out["db_bound"] = fastest_run([
        _checked(envs, f"bound{i}", lambda s: bound.database_bound(s, events), events,
                 {"batch_size": plan.default_batch}, expiry_topic=False) for i in range(plan.best_of)])
    progress("the batch transaction alone (apply_batch, no Kafka)")
    out["transaction_alone"] = [fastest_run([
        _checked(envs, f"txn{b}_{i}", lambda s: limits.batch_transaction_alone(s, events), events,
                 {"batch_size": b}, expiry_topic=False) for i in range(plan.best_of)]) for b in plan.batch_sizes]

    progress(f"lapse: 1 worker, batch {plan.default_batch}")
    # The first run's stage is "lapse1w": the audit replay below reads its expiry topic.
    runs = [fastest_run([_checked(envs, "lapse1w" if i == 0 else f"lapse1w_{i}",
                               partial(lapse_stage.run_lapse, events=n, workers=1), events,
                               {"workers": 1, "batch_size": plan.default_batch}) for i in range(plan.best_of)])]
    # Workers side by side: each count joins the group and takes its share before the events arrive
    # (with the backlog waiting, the first to join starts alone and a rebalance stops it mid-run).
    for workers in sorted({1, 2, plan.workers}):
        progress(f"lapse: {workers} worker(s) joined first, batch {plan.default_batch}")
        runs.append(fastest_run([
            _checked(envs, f"lapse{workers}wj_{i}",
                     partial(lapse_stage.run_lapse_joined, events=events, workers=workers), events,
                     {"workers": workers, "batch_size": plan.default_batch, "joined_first": True},
                     produced_by_stage=True) for i in range(plan.best_of)]))
    for b in plan.batch_sizes:
        if b != plan.default_batch:
            progress(f"lapse: 1 worker, batch {b}")
            runs.append(_checked(envs, f"lapse_b{b}", lambda s: lapse_stage.run_lapse(s, n, 1), events,
                                 {"workers": 1, "batch_size": b}))
    out["lapse"] = runs

    progress(f"relay: one relay publishing the outcomes of {n} events, batch of the relay's setting")
    out["relay"] = _in(envs, "relay", lambda s: relay_stage.run_relay(s, events, PARTITIONS), expiry_topic=False)

    progress(f"the Quix Streams peer on {n} events")
    out["quix"] = fastest_run([
        _checked(envs, f"quix{i}", lambda s: quix_stage.run_quix(s, n, plan.quix_python, PARTITIONS), events,
                 {"batch_size": quix_stage.PARTITION_BATCH}) for i in range(plan.best_of)])
    m = min(n, plan.baseline_cap)
    progress(f"naive consumer on {m} events")
    out["naive"] = _checked(envs, "naive", lambda s: naive.run_naive(s, m), events[:m])
    if plan.faust:
        progress(f"faust agent on {m} events")
        out["faust"] = _checked(envs, "faust", lambda s: faust_stage.run_faust(s, m), events[:m])
    progress(f"batched naive consumer on {n} events")
    out["batched_naive"] = _checked(envs, "batched", lambda s: naive.run_batched_naive(s, n), events,
                                    {"batch_size": naive.BATCHED_NAIVE_BATCH})

    one = _lapse_one_worker(out["lapse"], plan.default_batch)
    if not one["events_per_s"]:
        raise StageFailed(f"lapse with one worker at batch {plan.default_batch} has no rate to offer half of "
                          f"for the latency stage: {one['reason']}")
    rate = one["events_per_s"] / 2
    # The warm-up first: with every event measured, the worker's start (connections, statements
    # not yet prepared) and the producer's landed in the figures.
    warmup = max(0, min((n - 1) // 3, int(rate * LATENCY_WARMUP_S)))
    count = max(20, min(n - 1 - warmup, int(rate * plan.latency_seconds)))
    progress(f"latency at {rate:.0f} events/s offered, {count} events after {warmup} to warm up")
    out["latency"] = _in(envs, "latency", lambda s: latency.run_latency(s, rate, count, warmup),
                         batch_size=plan.default_batch)

    progress(f"reconciler scan over {plan.scan_rows} rows, audit replay of {n} records")
    out["reconciler_scan"] = _in(envs, "scan", lambda s: scans.reconciler_scan(s, plan.scan_rows))
    out["audit_replay"] = scans.audit_replay(envs.settings("lapse1w"))  # its topic holds all n

    progress(f"fairness: tenants B-E's 400 rows alone and behind tenant A's {plan.fairness_backlog:,}, "
             f"{plan.fairness_repeats} time(s) each")
    out["fairness"] = _in(envs, "fairness", lambda s: fairness.run_fairness(
        s, plan.fairness_backlog, workers=plan.workers, repeats=plan.fairness_repeats))

    progress(f"console pages on a ledger of {plan.console_rows:,} rows")
    out["console_pages"] = _in(envs, "console", lambda s: console_pages.console_pages(s, plan.console_rows, progress),
                               events=events)  # the cleanup group's lag is read on a topic with records
    return summarize(out, plan.default_batch)


def fastest_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest verified of a stage's runs (else its first), with every run's rate (`runs_events_per_s`)."""
    verified = [r for r in runs if r.get("verified") and r.get("events_per_s")]
    best = max(verified, key=lambda r: r["events_per_s"]) if verified else runs[0]
    return {**best, "runs_events_per_s": [r.get("events_per_s") for r in runs]}


def _in(envs: StageEnvironments, stage: str, fn: Callable[[Settings], T], **environment: Any) -> T:
    """Run one stage in its own environment (see StageEnvironments.stage for `environment`)."""
    with envs.stage(stage, **environment) as settings:
        return fn(settings)


def _checked(envs: StageEnvironments, stage: str, fn: Callable[[Settings], dict[str, Any]],
             events: list[ExpiryEvent], identity: dict[str, Any] | None = None, *,
             expiry_topic: bool = True, produced_by_stage: bool = False) -> dict[str, Any]:
    """Run a cleanup stage on `events` in its own environment (its batch size from `identity`; the
    events produced to its expiry topic first, unless it reads none or produces them itself), then
    check its end state there. A stage that fails is reported unverified with the reason, not
    raised: its figure does not count and the run goes on."""
    identity = identity or {}
    try:
        produced = events if expiry_topic and not produced_by_stage else ()
        with envs.stage(stage, events=produced, expiry_topic=expiry_topic,
                        batch_size=identity.get("batch_size")) as settings:
            result = fn(settings)
            return {**result, **verify_end_state(settings, events)}
    except Exception as exc:  # any failure of the stage (StageFailed, Kafka, the database)
        reason = f"the stage failed: {type(exc).__name__}: {exc}".splitlines()[0]
        log.warning("bench stage failed", extra={"stage": stage, "error": reason})
        return {**identity, "events": len(events), "seconds": None, "events_per_s": None, "verified": False,
                "reason": reason}


def _lapse_one_worker(runs: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    return next(r for r in runs if r["workers"] == 1 and r["batch_size"] == batch and not r.get("joined_first"))


def machine() -> dict[str, Any]:
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "python": platform.python_version(), "platform": platform.platform()}
