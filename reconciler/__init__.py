"""The reconciler room: rescan business tables and the ledger for work that never produced an
event or got stuck, and re-emit it. This module is the room's public face."""

from lapse.reconciler.scan import Reconciler, ReconcileReport, reconcile_once, scan_rate

__all__ = [
    "ReconcileReport",
    "Reconciler",
    "reconcile_once",
    "scan_rate",
]
