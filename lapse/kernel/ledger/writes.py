"""The writes accumulator: what one transaction writes to the ledger, collected while the rooms
decide and flushed once at the end.

Rules, leases, retries, replay and the reconciler say what happened to an operation (`finish`,
`fail`, `reschedule`, `transition`, `expiry`, …); `flush` turns it into the ledger's statements,
each one round trip for the whole transaction: finishes, moves out of a claim, transitions and
outbox rows (together, one statement on PostgreSQL), duplicate counts. Every transition is checked
against the state machine as it is recorded, so a disallowed one raises before anything is written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lapse.kernel.ledger import queries
from lapse.kernel.ledger.records import (
    ExpiryEvent,
    FailureEntry,
    Position,
    dead_letter_record,
    expiry_record,
    outcome_record,
)
from lapse.kernel.ledger.rows import ClaimedMove
from lapse.kernel.ledger.states import APPLIED, CLAIMED, DEAD_LETTER, HELD, PENDING, SHADOWED, SKIPPED, check
from lapse.kernel.schema_names import CLEANUP_OUTCOME, DEAD_LETTER_RECORD, EXPIRY_EVENT
from lapse.kernel.trace_context import TRACEPARENT

SHADOW_STATUS = "shadow"  # the outcome status of work a shadow-mode kind recorded instead of doing


@dataclass
class LedgerWrites:
    """The writes of one transaction by `actor` at `now`; outcomes go to `outcomes_topic`;
    `positions` says where each op key's consumed event was read (its transitions name it)."""

    actor: str
    now: datetime
    outcomes_topic: str | None = None
    positions: Mapping[str, Position] = field(default_factory=dict)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    finished: dict[str, list[str]] = field(default_factory=lambda: {APPLIED: [], SKIPPED: []})
    moves: list[ClaimedMove] = field(default_factory=list)
    duplicates: Counter[str] = field(default_factory=Counter)
    traces: dict[str, str] = field(default_factory=dict)  # op key → traceparent kept for a replay

    def transition(self, op_key: str, from_state: str | None, to_state: str, attempt: int, *,
                   failure_class: str | None = None, reason: str | None = None,
                   replay_id: str | None = None, correlation_id: str | None = None,
                   position: Position | None = None) -> None:
        """Record one transition (made by the event read at `position`, if one was); raises
        IllegalTransition for a move the state machine forbids."""
        check(from_state, to_state)
        topic, partition, offset = position or (None, None, None)
        self.transitions.append({
            "op_key": op_key,
            "from_state": from_state,
            "to_state": to_state,
            "attempt": attempt,
            "failure_class": failure_class,
            "reason": reason,
            "actor": self.actor,
            "replay_id": replay_id,
            "correlation_id": correlation_id,
            "at": self.now,
            "event_topic": topic,
            "event_partition": partition,
            "event_offset": offset,
        })

    def event_transition(self, event: ExpiryEvent, from_state: str | None, to_state: str,
                         attempt: int, *, failure_class: str | None = None,
                         reason: str | None = None) -> None:
        """`transition` for the operation of `event` (its replay and correlation ids, and where it
        was read if it was consumed)."""
        self.transition(event.op_key, from_state, to_state, attempt, failure_class=failure_class,
                        reason=reason, replay_id=event.replay_id, correlation_id=event.correlation_id,
                        position=self.positions.get(event.op_key))

    def finish(self, event: ExpiryEvent, from_state: str, state: str, attempt: int,
               reason: str | None = None) -> None:
        """The claimed operation reached applied or skipped at `attempt`: its transition from
        `from_state` (as read before the claim, with `reason` if any), the finishing update and
        the outcome."""
        if state not in self.finished:
            raise ValueError(f"finish is for applied or skipped, not {state}")
        self.event_transition(event, from_state, state, attempt, reason=reason)
        self.finished[state].append(event.op_key)
        self.outcome(event, state, attempt)

    def settled(self, event: ExpiryEvent, state: str, attempt: int) -> None:
        """An operation whose ledger row was already written finished in `state` at `attempt` — a
        first delivery's row inserted so (`queries.insert_settled`), or a waiting `pending` row
        moved so (`queries.settle_waiting`): the transition and outcome `finish` records for a
        claim of a `pending` row (from `pending`, no reason), without the finishing update."""
        if state not in self.finished:
            raise ValueError(f"settled is for applied or skipped, not {state}")
        self.event_transition(event, PENDING, state, attempt)
        self.outcome(event, state, attempt)

    def fail(self, event: ExpiryEvent, from_state: str, state: str, attempt: int, due_at: datetime,
             failure_class: str, reason: str) -> None:
        """The claimed operation failed: retry_scheduled at `due_at`, or dead_letter; its
        transition, the move out of the claim (failure persisted) and the outcome."""
        self.event_transition(event, from_state, state, attempt, failure_class=failure_class,
                              reason=reason)
        self.moves.append(ClaimedMove(event.op_key, state, attempt, due_at, failure_class, reason,
                                      self.now if state == DEAD_LETTER else None))
        self.outcome(event, state, attempt, failure_class, reason)

    def reschedule(self, event: ExpiryEvent, due_at: datetime, attempt: int,
                   reason: str | None = None) -> None:
        """The claimed operation is not due yet after all (or its subject does not exist yet, as
        `reason` says): back to pending at `due_at`."""
        self.event_transition(event, CLAIMED, PENDING, attempt,
                              reason=reason or f"rescheduled: not due until {due_at.isoformat()}")
        self.moves.append(ClaimedMove(event.op_key, PENDING, attempt, due_at, None, None, None))

    def parked(self, event: ExpiryEvent, from_state: str, state: str, attempt: int, reason: str) -> None:
        """The operation was parked by `queries.park` (held by a brake, or shadowed): its
        transition, and for a shadowed one the outcome with status `shadow`."""
        self.event_transition(event, from_state, state, attempt, reason=reason)
        if state == SHADOWED:
            self.outcome(event, SHADOW_STATUS, attempt, reason=reason)

    def hold_claim(self, event: ExpiryEvent, attempt: int, due_at: datetime, reason: str) -> None:
        """The claimed operation met a pause before its leased call ran: held, its attempt and due
        time unchanged."""
        self.event_transition(event, CLAIMED, HELD, attempt, reason=reason)
        self.moves.append(ClaimedMove(event.op_key, HELD, attempt, due_at, None, None, None))

    def outcome(self, event: ExpiryEvent, status: str, attempt: int,
                failure_class: str | None = None, reason: str | None = None) -> None:
        if self.outcomes_topic is None:
            raise ValueError("these writes were not given an outcomes topic")
        self._outbox(self.outcomes_topic, event.op_key, CLEANUP_OUTCOME,
                     outcome_record(event, status, attempt, self.actor, self.now, failure_class, reason),
                     traceparent=event.traceparent)

    def expiry(self, topic: str, event: ExpiryEvent, headers: Mapping[str, str] | None = None) -> None:
        """Publish `event` to `topic` (the expiry topic, or a delay tier) through the outbox."""
        self._outbox(topic, event.op_key, EXPIRY_EVENT, expiry_record(event, self.now), headers,
                     event.traceparent)

    def dead_letter(self, topic: str, event: ExpiryEvent, failure_class: str, reason: str,
                    attempt: int, history: Sequence[FailureEntry], position: Position | None) -> None:
        """Publish the dead letter of `event` to `topic` through the outbox; its trace context is
        kept with the ledger row too, for a replay to carry on."""
        record = dead_letter_record(failure_class, reason, attempt, self.now, event=event,
                                    history=history, position=position)
        self._outbox(topic, event.op_key, DEAD_LETTER_RECORD, record,
                     {"failure_class": failure_class, "reason": reason[:200]}, event.traceparent)
        if event.traceparent is not None:
            self.traces[event.op_key] = event.traceparent

    def _outbox(self, topic: str, key: str, schema: str, payload: dict[str, Any],
                headers: Mapping[str, str] | None = None, traceparent: str | None = None) -> None:
        carried = {**(headers or {}), TRACEPARENT: traceparent} if traceparent else dict(headers or {})
        self.outbox.append({"topic": topic, "key": key, "schema": schema, "payload": payload,
                            "headers": carried, "created_at": self.now})

    def flush(self, conn: Connection) -> None:
        """Write everything collected, once, in the caller's transaction; then start empty."""
        for state, op_keys in self.finished.items():
            queries.finish(conn, op_keys, self.actor, state, self.now)
        queries.move_claimed(conn, self.moves, self.actor, self.now)
        queries.insert_transitions_and_outbox(conn, self.transitions, self.outbox)
        queries.add_duplicates(conn, self.duplicates)
        queries.keep_traces(conn, self.traces)
        self.transitions, self.outbox, self.moves, self.traces = [], [], [], {}
        self.finished = {APPLIED: [], SKIPPED: []}
        self.duplicates = Counter()
