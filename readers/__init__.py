"""The readers room: consumers of history that never change it — the audit, status and lag,
committed offsets and their resets, and the analytics stream. This module is the room's face."""

from lapse.readers.audit import EVENT_FIELDS, AuditReport, run_audit
from lapse.readers.console_queries import (
    daily_reports,
    filtered_dead_letters,
    ledger_states,
    operator_action,
    throughput,
)
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
from lapse.readers.partition_ends import EndNotReached
from lapse.readers.status import status_report

__all__ = [
    "EVENT_FIELDS",
    "AuditReport",
    "EndNotReached",
    "OffsetsError",
    "Span",
    "committed",
    "daily_reports",
    "execute_reset",
    "filtered_dead_letters",
    "group_lag",
    "ledger_states",
    "manual_consumer",
    "operator_action",
    "partitions_of",
    "plan_reset",
    "read_spans",
    "run_audit",
    "status_report",
    "throughput",
]
