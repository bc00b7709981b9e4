"""The Prometheus endpoint of every long-running Lapse process, served on `metrics_port` at
`metrics_bind` (127.0.0.1 unless configured: this host only), and the alarm gauges the monitor role
sets from `lapse status` figures (`observe_status`). The processor's batch counters are defined in
its room (`lapse.processors.metrics`). In `lapse run` each role serves on metrics_port plus its
index, since every role is its own process.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge, start_http_server

from lapse.kernel.database import engine_from_settings
from lapse.kernel.ledger import STATES
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.readers import status_report

log = get_logger("metrics")

OLDEST_ELIGIBLE = Gauge("lapse_oldest_eligible_age_seconds",
                        "Age of the oldest due operation not finished (pending, claimed, retry).")
EXPIRED_CLAIMS = Gauge("lapse_expired_claims", "Claims whose lease has expired.")
OUTBOX_UNSENT = Gauge("lapse_outbox_unsent", "Outbox rows the relay has not published yet.")
OUTBOX_OLDEST_UNSENT = Gauge("lapse_outbox_oldest_unsent_age_seconds",
                             "Age of the oldest outbox row not yet published (0: none).")
LEDGER_ROWS = Gauge("lapse_ledger_rows", "Ledger rows by state.", ["state"])
LAG_RECORDS = Gauge("lapse_consumer_lag_records", "Records behind the end of the log.", ["group", "topic"])
LAG_SECONDS = Gauge("lapse_consumer_lag_seconds", "Age of the oldest unconsumed record.", ["group", "topic"])

_served: set[int] = set()
_lag_labels: set[tuple[str, str]] = set()  # the (group, topic) series the last observe_status set


def serve(settings: Settings, offset: int = 0) -> int | None:
    """Serve /metrics on settings.runtime.metrics_port + offset (once per process) at
    settings.runtime.metrics_bind (127.0.0.1 unless configured); None when no port is set."""
    if settings.runtime.metrics_port is None:
        return None
    port = settings.runtime.metrics_port + offset
    if port not in _served:
        start_http_server(port, addr=settings.runtime.metrics_bind)
        _served.add(port)
        log.info("metrics served", extra={"port": port, "bind": settings.runtime.metrics_bind})
    return port


def observe_status(report: dict[str, Any]) -> None:
    """Set the alarm gauges from a `lapse.readers.status.status_report` dict, leaving no series of
    an earlier report behind: every ledger state is set (0 when absent), lag series not in this
    report are removed. `lapse_ledger_rows` of applied and skipped may be estimates (the report's
    `ledger_estimated`)."""
    OLDEST_ELIGIBLE.set(report["oldest_eligible_age_s"] or 0)
    EXPIRED_CLAIMS.set(report["expired_claims"]["count"])
    OUTBOX_UNSENT.set(report["outbox"]["unsent"])
    OUTBOX_OLDEST_UNSENT.set(report["outbox"]["oldest_unsent_age_s"] or 0)
    # Every state every time (0 when it has no rows), so a state emptied since shows 0, not its
    # last count.
    for state in STATES:
        LEDGER_ROWS.labels(state=state).set(sum(report["ledger"].get(state, {}).values()))
    # The lag of the (group, topic) pairs in this report; a pair gone from it, or whose lag could
    # not be read this time, loses its series rather than keep a stale value.
    lag = {(row["group"], row["topic"]): row for row in report.get("lag", []) if "error" not in row}
    for labels in _lag_labels - lag.keys():
        LAG_RECORDS.remove(*labels)
        LAG_SECONDS.remove(*labels)
    for (group, topic), row in lag.items():
        LAG_RECORDS.labels(group=group, topic=topic).set(row["records"])
        LAG_SECONDS.labels(group=group, topic=topic).set(row["seconds"])
    _lag_labels.clear()
    _lag_labels.update(lag.keys())


def monitor(settings: Settings, stop: threading.Event, interval_s: float = 15.0) -> None:
    """Refresh the status gauges every `interval_s` until stopped."""
    engine = engine_from_settings(settings)
    try:
        while not stop.is_set():
            try:
                observe_status(status_report(settings, engine, datetime.now(UTC)))
            except Exception as exc:
                log.warning("status refresh failed", extra={"error": str(exc)[:200]})
            stop.wait(interval_s)
    finally:
        engine.dispose()
