"""The `lapse status` figures as Prometheus samples, read when /metrics is scraped.

A collector that yields what it reads at scrape time cannot keep a stale label: a ledger state, a
kind or a (group, topic) pair that is gone from the reading is gone from the scrape. One reading
(`lapse.readers.status.status_report`, the same queries as `lapse status`: partial indexes and
the planner's estimates, no whole-table count) serves every scrape for `max_age_s`, so several
Prometheus servers or a refreshing dashboard do not multiply the queries. A reading that fails (the
database or the broker away) is `lapse_status_up 0` and no other status sample, never an error
of /metrics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from lapse.kernel.database import engine_from_settings
from lapse.kernel.ledger import STATES
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.readers import status_report

log = get_logger("metrics")

# How long one reading serves scrapes: below Prometheus' usual 15 s interval, so each server's
# scrape still sees a fresh reading, above the burst of a few scrapers at once.
DEFAULT_MAX_AGE_S = 5.0


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def status_families(report: dict[str, Any]) -> list[Metric]:
    """The status samples of one `status_report` dict. Every ledger state has a sample (0 when it
    has no rows); lag samples exist for the (group, topic) pairs whose lag could be read, and
    `lapse_consumer_lag_readable` says which could not."""
    oldest = _gauge("lapse_oldest_eligible_age_seconds",
                    "Age of the oldest due operation not finished: unfinished ledger rows past due and due "
                    "business rows with no ledger row yet (0: none).")
    oldest.add_metric([], report["oldest_eligible_age_s"] or 0)
    eligible_rows = _gauge("lapse_eligible_rows", "Due business rows whose cleanup is not done, per declared "
                           "kind (counted up to a cap).", ["kind"])
    eligible_age = _gauge("lapse_eligible_oldest_age_seconds", "Age of the oldest due business row whose "
                          "cleanup is not done, per declared kind (0: none).", ["kind"])
    for kind, work in sorted((report.get("eligible") or {}).items()):
        eligible_rows.add_metric([kind], work["rows"])
        eligible_age.add_metric([kind], work["oldest_due_age_s"] or 0)
    expired = _gauge("lapse_expired_claims", "Claims whose lease has expired.")
    expired.add_metric([], report["expired_claims"]["count"])
    unsent = _gauge("lapse_outbox_unsent", "Outbox rows the relay has not published yet.")
    unsent.add_metric([], report["outbox"]["unsent"])
    unsent_age = _gauge("lapse_outbox_oldest_unsent_age_seconds",
                        "Age of the oldest outbox row not yet published (0: none).")
    unsent_age.add_metric([], report["outbox"]["oldest_unsent_age_s"] or 0)
    ledger = _gauge("lapse_ledger_rows", "Ledger rows by state (applied and skipped are the planner's "
                    "estimates on a large PostgreSQL ledger).", ["state"])
    for state in STATES:
        ledger.add_metric([state], sum(report["ledger"].get(state, {}).values()))
    readable = _gauge("lapse_consumer_lag_readable", "1 when the lag of a declared (group, topic) could be "
                      "read at the last reading, 0 when it could not.", ["group", "topic"])
    lag_records = _gauge("lapse_consumer_lag_records", "Records behind the end of the log.", ["group", "topic"])
    lag_seconds = _gauge("lapse_consumer_lag_seconds", "Age of the oldest unconsumed record (0: none).",
                         ["group", "topic"])
    members = _gauge("lapse_group_members", "Members of a declared consumer group (0: nothing consumes "
                     "for it).", ["group"])
    for row in report.get("lag", []):
        labels = [row["group"], row["topic"]]
        readable.add_metric(labels, 0 if "error" in row else 1)
        if "error" not in row:
            lag_records.add_metric(labels, row["records"])
            lag_seconds.add_metric(labels, row["seconds"])
    described = {row["group"]: row["group_state"]["members"] for row in report.get("lag", [])
                 if "members" in (row.get("group_state") or {})}
    for group, n in sorted(described.items()):
        members.add_metric([group], n)
    circuits = _gauge("lapse_dead_letter_circuits_open", "Partitions whose dead-letter circuit is open now.")
    circuits.add_metric([], len((report.get("findings") or {}).get("open_circuits", [])))
    return [oldest, eligible_rows, eligible_age, expired, unsent, unsent_age, ledger, readable, lag_records,
            lag_seconds, members, circuits, *brake_families(report.get("brakes") or {}),
            *limit_families(report.get("limits") or {})]


def brake_families(brakes: dict[str, Any]) -> list[Metric]:
    """The brakes' samples: each pause's age and the work waiting under it, held work of
    undeclared kinds, shadowed work per shadow-mode kind."""
    age = _gauge("lapse_pause_age_seconds", "How long a kind (or one tenant of it: tenant label) has been paused, "
                 "by cause (operator or budget).", ["kind", "tenant", "cause"])
    waiting = _gauge("lapse_pause_waiting_operations", "Operations held under a pause.", ["kind", "tenant", "cause"])
    for pause in brakes.get("pauses", []):
        labels = [pause["kind"], pause["tenant"] or "", pause["cause"]]
        age.add_metric(labels, pause["age_s"] or 0)
        waiting.add_metric(labels, pause["waiting"])
    undeclared = _gauge("lapse_undeclared_operations", "Operations held because the kinds file no longer "
                        "declares their kind.", ["kind"])
    for kind, n in brakes.get("undeclared", {}).items():
        undeclared.add_metric([kind], n)
    shadowed = _gauge("lapse_shadowed_operations", "Operations a shadow-mode kind recorded instead of applying.",
                      ["kind"])
    for kind, n in brakes.get("shadowed", {}).items():
        shadowed.add_metric([kind], n)
    return [age, waiting, undeclared, shadowed]


def limit_families(limits: dict[str, Any]) -> list[Metric]:
    """The call limits' samples, per route (a kind, or an endpoint or tenant of it: route label
    '', 'endpoint:HOST', 'tenant:NAME'), as every worker shares them: the rate now and declared,
    how long a Retry-After still stops it, the concurrency slots held."""
    labels = ["kind", "route"]
    rate = _gauge("lapse_limit_rate_per_s", "A route's rate now: halved by a 429, climbing back to the declared.",
                  labels)
    ceiling = _gauge("lapse_limit_ceiling_per_s", "A route's declared rate.", labels)
    blocked = _gauge("lapse_limit_blocked_seconds", "How long a Retry-After still stops a route's calls (0: not "
                     "stopped).", labels)
    held = _gauge("lapse_limit_slots_held", "Concurrency slots of a route held by workers now.", labels)
    for route in limits.get("routes", []):
        values = [route["kind"], route["route"]]
        rate.add_metric(values, route["rate_per_s"])
        ceiling.add_metric(values, route["ceiling_per_s"])
        blocked.add_metric(values, route["blocked_for_s"] or 0)
        held.add_metric(values, route["slots_held"])
    return [rate, ceiling, blocked, held]


class StatusCollector(Collector):
    """Yields the status samples at scrape time from a reading at most `max_age_s` old.

    `read` returns a `status_report` dict; scrapes that arrive while a reading runs wait for it
    rather than start their own."""

    def __init__(self, read: Callable[[], dict[str, Any]], max_age_s: float = DEFAULT_MAX_AGE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._families: list[Metric] = []
        self._up = 0.0
        self._seconds = 0.0

    def _refresh(self) -> None:
        started = self._clock()
        try:
            self._families, self._up = status_families(self._read()), 1.0
        except Exception as exc:  # an outage is a sample (`lapse_status_up 0`), not a failed scrape
            log.warning("status reading failed", extra={"error": str(exc)[:200]})
            self._families, self._up = [], 0.0
        self._read_at = self._clock()
        self._seconds = self._read_at - started

    def describe(self) -> Iterator[Metric]:
        """The names this collector yields, without a reading: registering it queries nothing."""
        empty = {"eligible": {"_": {"rows": 0, "oldest_due_age_s": None}}, "expired_claims": {"count": 0},
                 "oldest_eligible_age_s": None, "outbox": {"unsent": 0, "oldest_unsent_age_s": None},
                 "ledger": {}, "lag": [{"group": "_", "topic": "_", "records": 0, "seconds": 0.0}]}
        yield from (_gauge(name, "") for name in ("lapse_status_up", "lapse_status_reading_seconds"))
        yield from status_families(empty)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._read_at is None or self._clock() - self._read_at >= self._max_age_s:
                self._refresh()
            families, up, seconds = self._families, self._up, self._seconds
        status_up = _gauge("lapse_status_up", "1 when the last status reading succeeded, 0 when the database "
                           "(or the broker) could not be read; the other status samples are then absent.")
        status_up.add_metric([], up)
        took = _gauge("lapse_status_reading_seconds", "How long the last status reading took.")
        took.add_metric([], seconds)
        yield status_up
        yield took
        yield from families


def status_reader(settings: Settings, engine: Engine) -> Callable[[], dict[str, Any]]:
    """A reading of `lapse status` (lag included) at the time it is called."""
    return lambda: status_report(settings, engine, datetime.now(UTC))


@contextmanager
def status_collector(settings: Settings, max_age_s: float = DEFAULT_MAX_AGE_S) -> Iterator[StatusCollector]:
    """A status collector reading the configured database and brokers; its engine connects at the
    first scrape and is disposed on exit."""
    engine = engine_from_settings(settings)
    try:
        yield StatusCollector(status_reader(settings, engine), max_age_s)
    finally:
        engine.dispose()
