"""The cleanup rules for one batch, as plain functions over a database connection.

`apply_batch` runs inside the caller's transaction: it creates missing ledger rows, claims the
claimable ones, runs each kind's in-database effect, and records transitions and outbox rows. It
never touches Kafka, so it is tested against a real database with no broker.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection

from lapse.kinds import CleanupKind
from lapse.ledger import APPLIED, CLAIMED, DEAD_LETTER, SKIPPED, TERMINAL, ExpiryEvent
from lapse.ledger_queries import (
    insert_outbox,
    insert_pending,
    millis,
    outbox_row,
    record_transitions,
    transition,
)
from processors import queries


@dataclass(frozen=True)
class Topics:
    outcomes: str
    dlq: str


@dataclass
class BatchResult:
    """What one batch did, for the commit step, metrics and logs."""

    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    duplicates: int = 0
    conflicts: list[str] = field(default_factory=list)
    not_due: list[ExpiryEvent] = field(default_factory=list)
    leased: list[ExpiryEvent] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return len(self.applied) + len(self.skipped) + len(self.dead_lettered)


def collapse(events: list[ExpiryEvent]) -> tuple[dict[str, ExpiryEvent], Counter]:
    """One event per op key (the latest attempt wins); the rest are duplicates of this batch."""
    unique: dict[str, ExpiryEvent] = {}
    extra: Counter = Counter()
    for event in events:
        seen = unique.get(event.op_key)
        if seen is None:
            unique[event.op_key] = event
        else:
            extra[event.op_key] += 1
            if event.attempt > seen.attempt:
                unique[event.op_key] = event
    return unique, extra


def outcome_payload(
    event: ExpiryEvent, status: str, attempt: int, now: datetime, worker: str,
    failure_class: str | None = None, reason: str | None = None,
) -> dict:
    return {
        "op_key": event.op_key,
        "kind": event.kind,
        "tenant": event.tenant,
        "subject_id": event.subject_id,
        "status": status,
        "attempt": attempt,
        "failure_class": failure_class,
        "reason": reason,
        "due_at": millis(event.due_at),
        "occurred_at": millis(now),
        "correlation_id": event.correlation_id,
        "replay_id": event.replay_id,
        "worker": worker,
    }


def dead_letter_payload(event: ExpiryEvent, failure_class: str, reason: str, attempt: int,
                        now: datetime, position: tuple[str, int, int] | None) -> dict:
    topic, partition, offset = position or ("", -1, -1)
    return {
        "op_key": event.op_key,
        "kind": event.kind,
        "tenant": event.tenant,
        "subject_id": event.subject_id,
        "failure_class": failure_class,
        "reason": reason,
        "attempt": attempt,
        "history": [],
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "original_key": None,
        "original_value": None,
        "original_headers": {},
        "dead_lettered_at": millis(now),
        "correlation_id": event.correlation_id,
        "replay_id": event.replay_id,
    }


def apply_batch(
    conn: Connection,
    events: list[ExpiryEvent],
    *,
    kinds: dict[str, CleanupKind],
    topics: Topics,
    worker: str,
    now: datetime,
    lease: timedelta,
    positions: dict[str, tuple[str, int, int]] | None = None,
) -> BatchResult:
    """Claim, apply and record one batch of decoded events in the caller's transaction.

    Events must name known kinds (the decoder dead-letters the others before this point)."""
    result = BatchResult()
    unique, extra = collapse(events)
    if not unique:
        return result
    insert_pending(conn, list(unique.values()), now)
    before = queries.read_states(conn, unique)
    claimed = queries.claim(conn, list(unique), worker, now, now + lease)

    duplicates = Counter(extra)
    for key, event in unique.items():
        if key in claimed:
            continue
        state, attempt, due_at, owner, claim_until, *_ = before[key]
        if state in TERMINAL or event.attempt < attempt:
            duplicates[key] += 1  # already done, or a stale wake-up of an earlier attempt
        elif state == CLAIMED:
            result.conflicts.append(key)  # another worker holds a live lease
        else:
            result.not_due.append(event)  # early: goes back through a delay tier
    result.duplicates = sum(duplicates.values())

    by_kind: dict[str, list[ExpiryEvent]] = {}
    for key in claimed:
        by_kind.setdefault(unique[key].kind, []).append(unique[key])

    transitions: list[dict] = []
    outbox: list[dict] = []
    invalid: list[tuple[ExpiryEvent, str]] = []
    for kind_name, batch in by_kind.items():
        kind = kinds[kind_name]
        if kind.apply_in_db is None:
            result.leased.extend(batch)
            continue
        subjects: dict[str, object] = {}
        for event in batch:
            try:
                subjects[event.subject_id] = kind.parse_subject(event.subject_id)
            except ValueError as exc:
                invalid.append((event, str(exc)))
        changed = kind.apply_in_db(conn, list(subjects.values()), now)
        for event in batch:
            if event.subject_id not in subjects:
                continue
            status = APPLIED if event.subject_id in changed else SKIPPED
            (result.applied if status == APPLIED else result.skipped).append(event.op_key)
            attempt = before[event.op_key][1] + 1
            transitions.append(transition(
                event.op_key, before[event.op_key][0], status, attempt, worker,
                now, replay_id=event.replay_id, correlation_id=event.correlation_id))
            outbox.append(outbox_row(topics.outcomes, event.op_key, "cleanup_outcome",
                                     outcome_payload(event, status, attempt, now, worker), now))

    queries.finish(conn, result.applied, worker, APPLIED, now)
    queries.finish(conn, result.skipped, worker, SKIPPED, now)
    if invalid:
        dead_letter_invalid(conn, invalid, result, topics=topics, worker=worker, now=now,
                            before=before, positions=positions or {}, transitions=transitions,
                            outbox=outbox)
    record_transitions(conn, transitions)
    insert_outbox(conn, outbox)
    queries.add_duplicates(conn, duplicates)
    return result


def dead_letter_invalid(conn, invalid, result, *, topics, worker, now, before, positions,
                        transitions, outbox) -> None:
    """Invalid work is dead-lettered at once: the ledger row, a transition, a DLQ record and an
    outcome, all in this transaction."""
    rows = []
    for event, reason in invalid:
        attempt = before[event.op_key][1] + 1
        rows.append({"op_key": event.op_key, "state": DEAD_LETTER, "attempt": attempt,
                     "due_at": event.due_at, "failure_class": "invalid", "failure": reason,
                     "finished_at": now})
        result.dead_lettered.append(event.op_key)
        transitions.append(transition(
            event.op_key, before[event.op_key][0], DEAD_LETTER, attempt, worker, now,
            failure_class="invalid", reason=reason, replay_id=event.replay_id,
            correlation_id=event.correlation_id))
        outbox.append(outbox_row(
            topics.dlq, event.op_key, "dead_letter",
            dead_letter_payload(event, "invalid", reason, attempt, now, positions.get(event.op_key)),
            now, headers={"failure_class": "invalid", "reason": reason[:200]}))
        outbox.append(outbox_row(
            topics.outcomes, event.op_key, "cleanup_outcome",
            outcome_payload(event, DEAD_LETTER, attempt, now, worker, "invalid", reason), now))
    queries.finish_with_failure(conn, rows, worker, now)
