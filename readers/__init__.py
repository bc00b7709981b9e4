"""The readers room: consumers of history that never change it — the audit, status and lag, one
operation's history (`lapse show`), committed offsets and their resets, and the analytics stream.
This module is the room's face."""

from lapse.readers.analytics import AnalyticsOptions, run_analytics
from lapse.readers.archived_history import archived_operation
from lapse.readers.audit import BROKEN, EVENT_FIELDS, INCOMPLETE, AuditReport, run_audit
from lapse.readers.console_queries import (
    GROUPED_CAP,
    daily_reports,
    dead_letter_groups,
    filtered_dead_letters,
    ledger_states,
    operation_of_subject,
    operator_action,
    throughput,
    transition_buckets,
)
from lapse.readers.coverage import gap_line
from lapse.readers.history import (
    correlated_op_keys,
    has_operation,
    iso,
    known_kind,
    known_tenant,
    lapse_op_keys,
    operation_history,
    tenant_operations,
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
    read_to_end,
)
from lapse.readers.status import brakes_status, lag_status, status_report

__all__ = [
    "BROKEN",
    "EVENT_FIELDS",
    "GROUPED_CAP",
    "INCOMPLETE",
    "AnalyticsOptions",
    "AuditReport",
    "OffsetsError",
    "Span",
    "archived_operation",
    "brakes_status",
    "committed",
    "correlated_op_keys",
    "daily_reports",
    "dead_letter_groups",
    "execute_reset",
    "filtered_dead_letters",
    "gap_line",
    "group_lag",
    "has_operation",
    "iso",
    "known_kind",
    "known_tenant",
    "lag_status",
    "lapse_op_keys",
    "ledger_states",
    "manual_consumer",
    "operation_history",
    "operation_of_subject",
    "operator_action",
    "partitions_of",
    "plan_reset",
    "read_spans",
    "read_to_end",
    "run_analytics",
    "run_audit",
    "status_report",
    "tenant_operations",
    "throughput",
    "transition_buckets",
]
