"""The reconciler room: rescan business tables and the ledger for work that never produced an
event or got stuck, and re-emit it; release parked work whose brake is off. This module is the room's public face."""

from lapse.reconciler.release import ReleaseReport, release_parked_work
from lapse.reconciler.scan import Reconciler, ReconcileReport, reconcile_once, scan_rate

__all__ = [
    "ReconcileReport",
    "Reconciler",
    "ReleaseReport",
    "reconcile_once",
    "release_parked_work",
    "scan_rate",
]
