"""The readers room: consumers of history that never change it — the audit, status and lag,
committed offsets and their resets, and the analytics stream. This module is the room's face."""

from lapse.readers.audit import EVENT_FIELDS, AuditReport, run_audit
from lapse.readers.offsets import (
    OffsetsError,
    Span,
    committed,
    execute_reset,
    group_lag,
    manual_consumer,
    partitions_of,
    plan_reset,
    read_spans,
)
from lapse.readers.status import status_report

__all__ = [
    "EVENT_FIELDS",
    "AuditReport",
    "OffsetsError",
    "Span",
    "committed",
    "execute_reset",
    "group_lag",
    "manual_consumer",
    "partitions_of",
    "plan_reset",
    "read_spans",
    "run_audit",
    "status_report",
]
