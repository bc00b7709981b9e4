"""Typed rows of the ledger statements: what they return, and what the batched updates take."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """A ledger row as the state machine works with it (`queries.ROW_COLUMNS`, in this order)."""

    op_key: str
    state: str
    attempt: int
    due_at: datetime
    claim_owner: str | None
    claim_until: datetime | None
    kind: str
    subject_id: str
    tenant: str
    correlation_id: str
    replay_id: str | None
    last_failure_class: str | None


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A dead-lettered operation as an operator lists it (`queries.DEAD_LETTER_COLUMNS`)."""

    op_key: str
    kind: str
    tenant: str
    subject_id: str
    attempt: int
    last_failure_class: str | None
    last_failure: str | None
    replay_id: str | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class ClaimedMove:
    """A claimed row leaving its claim for `state` (pending, retry_scheduled or dead_letter) with
    the attempt count, due time and failure it then has; `finished_at` only for a dead letter."""

    op_key: str
    state: str
    attempt: int
    due_at: datetime
    failure_class: str | None
    failure: str | None
    finished_at: datetime | None


@dataclass(frozen=True)
class Selection:
    """Which dead letters: by kind, tenant and/or explicit op keys (all optional, combined with
    AND); those already replayed once only with `include_replayed` (a discard always sets it)."""

    kind: str | None = None
    tenant: str | None = None
    op_keys: tuple[str, ...] = ()
    include_replayed: bool = False


@dataclass(frozen=True, slots=True)
class StateKindCount:
    """How many ledger rows of `kind` are in `state` (`reads.counts_by_state_and_kind`)."""

    state: str
    kind: str
    rows: int


@dataclass(frozen=True, slots=True)
class LedgerCounts:
    """The ledger's rows by (state, kind) (`reads.ledger_counts`); the counts of the states in
    `estimated` are the planner's estimates, every other count is exact."""

    counts: tuple[StateKindCount, ...]
    estimated: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class OutboxBacklog:
    """Outbox rows not yet published, and when the oldest of them was written (None: none); how
    far the relay is behind, an alarm signal of `lapse status`."""

    unsent: int
    oldest_created_at: datetime | None


@dataclass(frozen=True, slots=True)
class ExpiredClaims:
    """Claims whose lease has ended unfinished, and the earliest lease end among them (None: no
    such claim); an alarm signal of `lapse status`."""

    count: int
    oldest_claim_until: datetime | None


@dataclass(frozen=True, slots=True)
class TransitionCount:
    """Transitions into `to_state` recorded in a time window for rows of `kind`, and how many op
    keys made them (`reads.transitions_between`)."""

    kind: str
    to_state: str
    transitions: int
    op_keys: int
