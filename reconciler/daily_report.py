"""The daily cleanup report: built from the ledger transitions of one UTC day, stored once under the
stable key `daily-report:YYYY-MM-DD`, and delivered from that table (its outbox) to a notifier.

The report counts what the cleanup transactions recorded that day, never the business tables at
send time (a moving target). Enqueueing a date twice stores one report; a missed day is enqueued
explicitly by date, never by scanning history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Connection, Engine, select, update

from lapse.kernel.batch_sql import bulk_insert
from lapse.kernel.ledger import op_keys_moved_between, transitions_between
from lapse.kernel.logs import get_logger
from lapse.kernel.models import daily_reports
from lapse.reconciler.notifiers import Notifier

log = get_logger("report")

KEY_PREFIX = "daily-report:"
DELIVERY_BATCH = 50


def report_key(day: date) -> str:
    return f"{KEY_PREFIX}{day.isoformat()}"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return start, start + timedelta(days=1)


def build_report(conn: Connection, day: date, now: datetime) -> dict:
    """Counts of op keys by kind and state they reached during `day` (UTC), from the ledger
    transitions recorded that day."""
    start, end = day_bounds(day)
    by_kind: dict[str, dict[str, int]] = {}
    transitions = 0
    for count in transitions_between(conn, start, end):
        by_kind.setdefault(count.kind, {})[count.to_state] = count.op_keys
        transitions += count.transitions
    op_keys = op_keys_moved_between(conn, start, end)
    return {
        "report_key": report_key(day),
        "date": day.isoformat(),
        "from": start.isoformat(),
        "to": end.isoformat(),
        "transitions": transitions,
        "op_keys": op_keys,
        "op_keys_by_kind_and_state": by_kind,
        "generated_at": now.isoformat(),
    }


def enqueue_report(engine: Engine, day: date, now: datetime) -> tuple[str, bool]:
    """Store the report of `day` unless one exists; returns (key, whether this call stored it)."""
    with engine.begin() as conn:
        payload = build_report(conn, day, now)
        created = bulk_insert(conn, daily_reports, [{
            "report_key": payload["report_key"], "report_date": day, "payload": payload,
            "created_at": now, "attempts": 0,
        }], ignore_conflicts=True, returning=["report_key"])
    return payload["report_key"], bool(created)


@dataclass
class DeliveryResult:
    delivered: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def deliver_pending(engine: Engine, notifier: Notifier, now: datetime,
                    limit: int = DELIVERY_BATCH) -> DeliveryResult:
    """Send undelivered reports (oldest key first), each locked while it is sent and marked in the
    same transaction; a failure is recorded and retried by the next run. The notifier is
    idempotent by key, so a crash between send and commit cannot make a second notification."""
    result = DeliveryResult()
    with engine.connect() as conn:
        keys = conn.execute(select(daily_reports.c.report_key)
                            .where(daily_reports.c.delivered_at.is_(None))
                            .order_by(daily_reports.c.report_key).limit(limit)).scalars().all()
    for key in keys:
        try:
            with engine.begin() as conn:
                row = conn.execute(select(daily_reports.c.payload)
                                   .where(daily_reports.c.report_key == key,
                                          daily_reports.c.delivered_at.is_(None))
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
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            with engine.begin() as conn:
                conn.execute(update(daily_reports).where(daily_reports.c.report_key == key)
                             .values(attempts=daily_reports.c.attempts + 1, last_error=reason))
            result.failed[key] = reason
            log.warning("daily report not delivered", extra={"report_key": key, "error": reason})
    return result
