"""The daily cleanup report: built from the ledger transitions of one UTC day, stored under the
stable key `daily-report:YYYY-MM-DD`, and delivered from that table (its outbox) to a notifier.

The report counts what the cleanup transactions recorded that day, never the business tables at
send time (a moving target). A day closes at its end (midnight UTC) plus a grace period for late
commits. Until then its stored report says `partial: true`, is rebuilt by each run and is never
sent; once the day has closed, the final report (`partial: false`) replaces the partial one, is
never changed again and is sent once. A missed day is enqueued explicitly by date, never by
scanning history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, select, update

from lapse.kernel.batch_sql import bulk_insert
from lapse.kernel.ledger import op_keys_moved_between, transitions_between
from lapse.kernel.logs import get_logger
from lapse.kernel.models import daily_reports
from lapse.kernel.outages import is_transient
from lapse.reports.notifiers import Notifier

log = get_logger("report")

KEY_PREFIX = "daily-report:"
DELIVERY_BATCH = 50


def report_key(day: date) -> str:
    return f"{KEY_PREFIX}{day.isoformat()}"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def closes_at(day: date, grace: timedelta) -> datetime:
    """When `day` counts as closed: its end plus the grace period (transactions that began before
    midnight may commit their transitions a little after it)."""
    return day_bounds(day)[1] + grace


def is_partial() -> ColumnElement[bool]:
    """True for a stored report whose day had not closed when it was built (rebuilt, never sent)."""
    partial: ColumnElement[bool] = daily_reports.c.payload["partial"].as_boolean().is_(True)
    return partial


def build_report(conn: Connection, day: date, now: datetime, *, partial: bool = False) -> dict[str, Any]:
    """Counts of op keys by kind and state they reached during `day` (UTC), from the ledger
    transitions recorded that day — up to `now` while the day is still open (`partial`)."""
    start, end = day_bounds(day)
    until = min(end, max(start, now)) if partial else end
    by_kind: dict[str, dict[str, int]] = {}
    transitions = 0
    for count in transitions_between(conn, start, until):
        by_kind.setdefault(count.kind, {})[count.to_state] = count.op_keys
        transitions += count.transitions
    op_keys = op_keys_moved_between(conn, start, until)
    return {
        "report_key": report_key(day),
        "date": day.isoformat(),
        "from": start.isoformat(),
        "to": end.isoformat(),
        "partial": partial,
        "counted_until": until.isoformat(),
        "transitions": transitions,
        "op_keys": op_keys,
        "op_keys_by_kind_and_state": by_kind,
        "generated_at": now.isoformat(),
    }


STORED, REBUILT, FINALISED, UNCHANGED = "stored", "rebuilt", "finalised", "unchanged"


@dataclass(frozen=True)
class StoredReport:
    """What `enqueue_report` did for one day: `action` is stored (a new row), rebuilt (a partial
    report replaced by a newer partial one), finalised (a partial one replaced by the final one) or
    unchanged (the final report was already stored); `partial` tells which report the row holds."""

    key: str
    action: str
    partial: bool

    @property
    def changed(self) -> bool:
        return self.action != UNCHANGED


def enqueue_report(engine: Engine, day: date, now: datetime,
                   grace: timedelta = timedelta(0)) -> StoredReport:
    """Store the report of `day` as of `now`: partial while the day is open (`closes_at`), final
    once it has closed. A stored partial report is replaced; a final one never is, so two runs (or
    two report roles) store one final report whatever their order. One transaction."""
    partial = now < closes_at(day, grace)
    key = report_key(day)
    with engine.begin() as conn:
        payload = build_report(conn, day, now, partial=partial)
        created = bulk_insert(conn, daily_reports, [{
            "report_key": key, "report_date": day, "payload": payload, "created_at": now, "attempts": 0,
        }], ignore_conflicts=True, returning=["report_key"])
        if created:
            return StoredReport(key, STORED, partial)
        # The row exists: replace it only while it holds a partial report. The condition is
        # re-checked on the locked row, so of two concurrent final builds only one replaces it.
        replaced = conn.execute(update(daily_reports)
                                .where(daily_reports.c.report_key == key, daily_reports.c.delivered_at.is_(None),
                                       is_partial())
                                .values(payload=payload, created_at=now)).rowcount
    if replaced:
        return StoredReport(key, REBUILT if partial else FINALISED, partial)
    return StoredReport(key, UNCHANGED, False)


def partial_days(engine: Engine, before: datetime, grace: timedelta) -> list[date]:
    """Days whose stored report is still partial although the day closed before `before` (a run
    stopped over midnight): the few rows to finalise, read through the undelivered-reports index."""
    with engine.connect() as conn:
        rows = conn.execute(select(daily_reports.c.report_date)
                            .where(daily_reports.c.delivered_at.is_(None), is_partial())
                            .order_by(daily_reports.c.report_key)).scalars().all()
    return [day for day in rows if closes_at(day, grace) <= before]


@dataclass
class DeliveryResult:
    delivered: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def deliver_pending(engine: Engine, notifier: Notifier, now: datetime,
                    limit: int = DELIVERY_BATCH) -> DeliveryResult:
    """Send undelivered final reports (oldest key first; a partial report is never sent), each
    locked while it is sent and marked in the same transaction, so two runs cannot both send it; a
    failure is recorded and retried by the next run, an outage raised for the role to wait out. The
    notifier is idempotent by key, so a crash between send and commit cannot make a second
    notification."""
    result = DeliveryResult()
    with engine.connect() as conn:
        keys = conn.execute(select(daily_reports.c.report_key)
                            .where(daily_reports.c.delivered_at.is_(None), ~is_partial())
                            .order_by(daily_reports.c.report_key).limit(limit)).scalars().all()
    for key in keys:
        try:
            with engine.begin() as conn:
                row = conn.execute(select(daily_reports.c.payload)
                                   .where(daily_reports.c.report_key == key,
                                          daily_reports.c.delivered_at.is_(None), ~is_partial())
                                   .with_for_update(skip_locked=True)).first()
                if row is None:
                    continue  # delivered meanwhile by another run
                notifier.send(key, row.payload)
                conn.execute(update(daily_reports).where(daily_reports.c.report_key == key)
                             .values(delivered_at=now, attempts=daily_reports.c.attempts + 1,
                                     last_error=None))
            result.delivered.append(key)
            log.info("daily report delivered", extra={"report_key": key, "notifier": notifier.name})
        except Exception as exc:
            if is_transient(exc):  # the database away or read-only: no delivery attempt to count
                raise
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            with engine.begin() as conn:
                conn.execute(update(daily_reports).where(daily_reports.c.report_key == key)
                             .values(attempts=daily_reports.c.attempts + 1, last_error=reason))
            result.failed[key] = reason
            log.warning("daily report not delivered", extra={"report_key": key, "error": reason})
    return result
