"""Prometheus metrics of every long-running Lapse process, served on `metrics_port`.

The worker records each batch (`observe_batch`); the monitor role sets the alarm gauges from
`lapse status` figures (`observe_status`). In `lapse run` each role serves on metrics_port plus its
index, since every role is its own process.
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from datetime import UTC, datetime

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from lapse.logs import get_logger
from lapse.settings import Settings

log = get_logger("metrics")

EVENTS_CONSUMED = Counter("lapse_events_consumed", "Records consumed from the expiry topic.")
EFFECTS_APPLIED = Counter("lapse_effects_applied", "Cleanup effects applied (ledger: applied).")
EFFECTS_SKIPPED = Counter("lapse_effects_skipped", "Operations skipped: the business row no longer qualified.")
DUPLICATES = Counter("lapse_duplicates_absorbed", "Deliveries absorbed by the ledger as duplicates.")
RETRIES = Counter("lapse_retries", "Retries scheduled, by the attempt that failed.", ["attempt"])
DEAD_LETTERS = Counter("lapse_dead_letters", "Dead letters, by class (poison: undecodable input; "
                       "ledger: invalid or exhausted operations).", ["failure_class"])
CLAIM_CONFLICTS = Counter("lapse_claim_conflicts", "Events whose op key another worker held under a live lease.")
BATCH_SIZE = Histogram("lapse_batch_size", "Records per processed batch.",
                       buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000))
BATCH_SECONDS = Histogram("lapse_batch_seconds", "Wall time of one batch, decode to offset commit.",
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
OLDEST_ELIGIBLE = Gauge("lapse_oldest_eligible_age_seconds",
                        "Age of the oldest due operation not finished (pending, claimed, retry).")
EXPIRED_CLAIMS = Gauge("lapse_expired_claims", "Claims whose lease has expired.")
LEDGER_ROWS = Gauge("lapse_ledger_rows", "Ledger rows by state.", ["state"])
LAG_RECORDS = Gauge("lapse_consumer_lag_records", "Records behind the end of the log.", ["group", "topic"])
LAG_SECONDS = Gauge("lapse_consumer_lag_seconds", "Age of the oldest unconsumed record.", ["group", "topic"])

_served: set[int] = set()


def serve(settings: Settings, offset: int = 0) -> int | None:
    """Serve /metrics on settings.metrics_port + offset (once per process); None when unset."""
    if settings.metrics_port is None:
        return None
    port = settings.metrics_port + offset
    if port not in _served:
        start_http_server(port)
        _served.add(port)
        log.info("metrics served", extra={"port": port})
    return port


def observe_batch(records: int, result, events: list, poison: int, seconds: float) -> None:
    """Count one committed batch of the cleanup worker (`result` is a processors BatchResult)."""
    EVENTS_CONSUMED.inc(records)
    EFFECTS_APPLIED.inc(len(result.applied))
    EFFECTS_SKIPPED.inc(len(result.skipped))
    DUPLICATES.inc(result.duplicates)
    CLAIM_CONFLICTS.inc(len(result.conflicts))
    if result.retried:  # rare: look up attempts only for the batches that have retries
        retried = set(result.retried)
        attempts = Tally(str(e.attempt + 1) for e in events if e.op_key in retried)
        for attempt, n in attempts.items():
            RETRIES.labels(attempt=attempt).inc(n)
    if result.dead_lettered:
        DEAD_LETTERS.labels(failure_class="ledger").inc(len(result.dead_lettered))
    if poison:
        DEAD_LETTERS.labels(failure_class="poison").inc(poison)
    BATCH_SIZE.observe(records)
    BATCH_SECONDS.observe(seconds)


def observe_status(report: dict) -> None:
    """Set the alarm gauges from a `lapse.status.status_report` dict."""
    OLDEST_ELIGIBLE.set(report["oldest_eligible_age_s"] or 0)
    EXPIRED_CLAIMS.set(report["expired_claims"]["count"])
    for state, kinds in report["ledger"].items():
        LEDGER_ROWS.labels(state=state).set(sum(kinds.values()))
    for row in report.get("lag", []):
        if "error" not in row:
            LAG_RECORDS.labels(group=row["group"], topic=row["topic"]).set(row["records"])
            LAG_SECONDS.labels(group=row["group"], topic=row["topic"]).set(row["seconds"])


def monitor(settings: Settings, stop: threading.Event, interval_s: float = 15.0) -> None:
    """Refresh the status gauges every `interval_s` until stopped."""
    from lapse.database import engine_from_settings
    from lapse.status import status_report

    engine = engine_from_settings(settings)
    try:
        while not stop.is_set():
            try:
                observe_status(status_report(settings, engine, datetime.now(UTC)))
            except Exception as exc:  # noqa: BLE001 - a monitor keeps running through outages
                log.warning("status refresh failed", extra={"error": str(exc)[:200]})
            stop.wait(interval_s)
    finally:
        engine.dispose()


def run_monitor_role(settings: Settings, kwargs: dict) -> None:
    """The `lapse run` role that keeps the oldest-eligible, claim and lag gauges current."""
    from lapse.supervisor import stop_on_signals

    monitor(settings, stop_on_signals(), kwargs.get("interval_s", 15.0))
