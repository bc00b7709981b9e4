"""The ledger: one row per operation key, the state machine its rows follow, every statement that
reads or writes it, and the records that describe its work (expiry events, outcomes, dead letters).

This module is the package's face: every other module imports the ledger from here.

- `states`  — states and the allowed transitions, as data; `check` raises on any other move;
- `keys`    — op keys and correlation ids;
- `records` — the expiry event, its factory and validation, and the serializer of each record type
  (a dead letter's original bytes clipped to a budget);
- `rows`    — the typed rows the statements return and take;
- `queries` — every statement of the state machine (the SQL);
- `reads`   — the probes business-table selects embed, and the aggregates status and reports show;
- `writes`  — the accumulator a transaction fills and flushes once.
"""

from lapse.kernel.ledger.keys import InvalidEvent, InvalidOpKey, new_correlation_id, op_key, parse_op_key
from lapse.kernel.ledger.queries import (
    claim,
    dead_letters,
    failure_history,
    insert_pending,
    lock_claims,
    mark_stuck,
    mark_stuck_statement,
    pending_row,
    read_rows,
    release_dead_letters,
    renew_leases,
    stuck_cursor,
)
from lapse.kernel.ledger.reads import (
    counts_by_state_and_kind,
    expired_claims,
    has_ledger_row,
    ledger_state_of,
    oldest_unfinished_due,
    op_keys_moved_between,
    transitions_between,
)
from lapse.kernel.ledger.records import (
    ATTEMPT_CAP,
    EARLIEST_DUE,
    LATEST_DUE_AHEAD,
    ClippedOriginal,
    ExpiryEvent,
    FailureEntry,
    InvalidField,
    Original,
    OriginalBudget,
    Position,
    clip_original,
    dead_letter_record,
    event_for_row,
    expiry_event,
    expiry_record,
    millis,
    outcome_record,
    safe_text,
    time_problem,
)
from lapse.kernel.ledger.rows import (
    ClaimedMove,
    DeadLetterRow,
    ExpiredClaims,
    LedgerRow,
    Selection,
    StateKindCount,
    TransitionCount,
)
from lapse.kernel.ledger.states import (
    ALLOWED,
    APPLIED,
    CLAIMED,
    DEAD_LETTER,
    PENDING,
    RETRY_SCHEDULED,
    SKIPPED,
    STATES,
    TERMINAL,
    UNFINISHED,
    WAITING,
    IllegalTransition,
    allowed,
    check,
)
from lapse.kernel.ledger.writes import LedgerWrites

__all__ = [
    "ALLOWED",
    "APPLIED",
    "ATTEMPT_CAP",
    "CLAIMED",
    "DEAD_LETTER",
    "EARLIEST_DUE",
    "LATEST_DUE_AHEAD",
    "PENDING",
    "RETRY_SCHEDULED",
    "SKIPPED",
    "STATES",
    "TERMINAL",
    "UNFINISHED",
    "WAITING",
    "ClaimedMove",
    "ClippedOriginal",
    "DeadLetterRow",
    "ExpiredClaims",
    "ExpiryEvent",
    "FailureEntry",
    "IllegalTransition",
    "InvalidEvent",
    "InvalidField",
    "InvalidOpKey",
    "LedgerRow",
    "LedgerWrites",
    "Original",
    "OriginalBudget",
    "Position",
    "Selection",
    "StateKindCount",
    "TransitionCount",
    "allowed",
    "check",
    "claim",
    "clip_original",
    "counts_by_state_and_kind",
    "dead_letter_record",
    "dead_letters",
    "event_for_row",
    "expired_claims",
    "expiry_event",
    "expiry_record",
    "failure_history",
    "has_ledger_row",
    "insert_pending",
    "ledger_state_of",
    "lock_claims",
    "mark_stuck",
    "mark_stuck_statement",
    "millis",
    "new_correlation_id",
    "oldest_unfinished_due",
    "op_key",
    "op_keys_moved_between",
    "outcome_record",
    "parse_op_key",
    "pending_row",
    "read_rows",
    "release_dead_letters",
    "renew_leases",
    "safe_text",
    "stuck_cursor",
    "time_problem",
    "transitions_between",
]
