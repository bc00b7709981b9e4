"""The report role: the daily report, a pass every `report.interval_s` until stopped (`lapse report
--serve`, `lapse run`), or once for one day (`lapse report [--date]`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta

from lapse.kernel.clock import engine_now
from lapse.kernel.settings import Settings
from lapse.reports import (
    PassResult,
    StoredReport,
    deliver_pending,
    enqueue_report,
    notifier_from_settings,
    run_daily_reports,
)
from lapse.shell.roles.base import PassRole, is_outage, log, when_reachable


@dataclass(frozen=True)
class ReportRun:
    """One bounded run: the day's report as stored, and the final reports sent or failed (by key)."""

    stored: StoredReport
    delivered: list[str]
    failed: dict[str, str]


class ReportRole(PassRole[ReportRun | None]):
    """The daily report; `once`: store `day`'s report (default: yesterday) and deliver the pending
    ones. The notifier is built at once: one without what it needs is a ValueError."""

    name = "report"
    uses_kafka = False

    def __init__(self, settings: Settings, *, once: bool = False, day: date | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(settings, once=once, stop=stop)
        self.day = day
        self.notifier = notifier_from_settings(settings)
        self.grace = timedelta(seconds=settings.report.grace_s)

    def run(self) -> None:
        run_daily_reports(self.engine, self.notifier, grace=self.grace, interval_s=self.settings.report.interval_s,
                          stop=self.stop, attempt=lambda run: when_reachable(self.name, self.stop, _guarded(run)))

    def run_once(self) -> ReportRun:
        now = engine_now(self.engine)  # the report schedule: the database's clock
        day = self.day or (now - timedelta(days=1)).date()
        stored = enqueue_report(self.engine, day, now, self.grace)
        result = deliver_pending(self.engine, self.notifier, now)
        return ReportRun(stored, result.delivered, result.failed)


def _guarded(run: Callable[[], PassResult]) -> Callable[[], PassResult]:
    """`run`, with a failed pass logged and tried again next time; an outage is raised to be waited out."""
    def one_pass() -> PassResult:
        try:
            return run()
        except Exception as exc:
            if is_outage(exc):
                raise
            log.exception("report pass failed")
            return PassResult()
    return one_pass
