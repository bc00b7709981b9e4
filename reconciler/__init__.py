"""The reconciler room: rescan business tables and the ledger for work that never produced an
event or got stuck, and the daily report. This module is the room's public face."""

from lapse.reconciler.daily_report import deliver_pending, enqueue_report
from lapse.reconciler.notifiers import notifier_from_settings
from lapse.reconciler.scan import Reconciler, ReconcileReport, reconcile_once, scan_rate

__all__ = [
    "ReconcileReport",
    "Reconciler",
    "deliver_pending",
    "enqueue_report",
    "notifier_from_settings",
    "reconcile_once",
    "scan_rate",
]
