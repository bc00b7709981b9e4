"""When the daily report is built and sent: the report role's pass, and its loop.

Each pass rebuilds the report of every day still open (`partial: true`), stores the final report of
every day that has closed since (yesterday, and any day whose stored report is still partial
because no pass ran after it closed), then sends the final reports not yet delivered. Everything a
pass decides is in the database (the report's row and its key), so a restarted role or a second
report role sends nothing twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from sqlalchemy import Engine

from lapse.kernel.clock import Clock, engine_now
from lapse.kernel.logs import get_logger
from lapse.reports.daily_report import (
    DeliveryResult,
    StoredReport,
    deliver_pending,
    enqueue_report,
    partial_days,
)
from lapse.reports.notifiers import Notifier

log = get_logger("report")

def days_to_report(now: datetime, grace: timedelta) -> list[date]:
    """Yesterday and today as the grace period sees them, and today: the day that may just have
    closed (its final report) and the day or two still open (their partial reports)."""
    closing = (now - grace).date()
    return sorted({closing - timedelta(days=1), closing, now.date()})


@dataclass
class PassResult:
    """One pass: what was stored per day, and what was delivered."""

    stored: list[StoredReport] = field(default_factory=list)
    delivery: DeliveryResult = field(default_factory=DeliveryResult)


def report_pass(engine: Engine, notifier: Notifier, now: datetime, grace: timedelta) -> PassResult:
    """Store (or rebuild) the reports of the days around `now` and of closed days still partial,
    then deliver the final reports not yet sent."""
    days = sorted(set(days_to_report(now, grace)) | set(partial_days(engine, now, grace)))
    result = PassResult(stored=[enqueue_report(engine, day, now, grace) for day in days])
    for stored in result.stored:
        if stored.changed and not stored.partial:
            log.info("daily report final", extra={"report_key": stored.key})
    result.delivery = deliver_pending(engine, notifier, now)
    return result


def run_daily_reports(engine: Engine, notifier: Notifier, *, grace: timedelta, interval_s: float,
                      stop: threading.Event, clock: Clock | None = None,
                      attempt: Callable[[Callable[[], PassResult]], PassResult | None] = lambda run: run(),
                      on_pass: Callable[[PassResult], None] | None = None) -> None:
    """A report pass every `interval_s` seconds until `stop` is set. `clock` gives each pass its
    time (tests move it; default: the database's); `attempt` runs each pass (the report role waits
    out an outage there; None means it was stopped meanwhile); `on_pass` sees each pass's result."""
    while not stop.is_set():
        result = attempt(lambda: report_pass(engine, notifier, engine_now(engine, clock), grace))
        if result is None:
            return
        if on_pass is not None:
            on_pass(result)
        stop.wait(interval_s)
