"""The reconciler room: rescan business tables and the ledger for work that never produced an
event or got stuck, the daily report, and retention (the prune of finished rows). This module is
the room's public face."""

from lapse.reconciler.daily_report import StoredReport, deliver_pending, enqueue_report
from lapse.reconciler.horizons import Horizon, HorizonRefused, Horizons, horizons_from_settings
from lapse.reconciler.notifiers import notifier_from_settings
from lapse.reconciler.prune import PruneReport, prune_dry_run, prune_once
from lapse.reconciler.report_schedule import PassResult, report_pass, run_daily_reports
from lapse.reconciler.scan import Reconciler, ReconcileReport, reconcile_once, scan_rate

__all__ = [
    "Horizon",
    "HorizonRefused",
    "Horizons",
    "PassResult",
    "PruneReport",
    "ReconcileReport",
    "Reconciler",
    "StoredReport",
    "deliver_pending",
    "enqueue_report",
    "horizons_from_settings",
    "notifier_from_settings",
    "prune_dry_run",
    "prune_once",
    "reconcile_once",
    "report_pass",
    "run_daily_reports",
    "scan_rate",
]
