"""The reports room: the daily cleanup report — built from one UTC day's ledger transitions,
stored, and sent once to a notifier (a file or SMTP) — and the report role's schedule. This module
is the room's public face."""

from lapse.reports.daily_report import StoredReport, deliver_pending, enqueue_report
from lapse.reports.notifiers import notifier_from_settings
from lapse.reports.report_schedule import PassResult, report_pass, run_daily_reports

__all__ = [
    "PassResult",
    "StoredReport",
    "deliver_pending",
    "enqueue_report",
    "notifier_from_settings",
    "report_pass",
    "run_daily_reports",
]
