"""The cleanup rules for one batch, as plain functions over the batch's scope.

`apply_batch` runs inside the transaction its caller began on the scope's connection: it creates
missing ledger rows, claims the claimable ones, runs each kind's in-database effect (or leases
its external one), decides what happened to each event, and flushes the ledger writes once. It
never touches Kafka, so it is tested against a real database with no broker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from lapse.kernel.kinds import CleanupKind, ExternalEffect
from lapse.kernel.ledger import (
    APPLIED,
    CLAIMED,
    RETRY_SCHEDULED,
    SKIPPED,
    TERMINAL,
    ExpiryEvent,
    LedgerRow,
    claim,
    insert_pending,
    millis,
    read_rows,
    safe_text,
)
from lapse.processors.failures import INVALID, EffectFailure
from lapse.processors.retries import FailedAttempt, record_failures, wake_up
from lapse.processors.scope import BatchResult, BatchScope

Invalid = tuple[ExpiryEvent, str]  # an event whose work can never run, and why
REASON_LIMIT = 500  # characters of a dead-letter reason written to the ledger


@dataclass(frozen=True)
class KindRun:
    """One kind's claimed events after step 4: those left to record (not leased) with their
    parsed subjects, the subject ids the in-database effect changed, and the invalid ones."""

    kind: CleanupKind
    to_record: list[tuple[ExpiryEvent, Any]]
    changed: set[str]
    invalid: list[Invalid]


def apply_batch(scope: BatchScope, events: Sequence[ExpiryEvent]) -> BatchResult:
    """Claim, apply and record one batch of decoded events in the scope's transaction.

    Events must name known kinds (the decoder dead-letters the others before this point).

    1. Collapse: one event per op key, the latest attempt winning; the others are duplicates.
    2. Claim: create the missing ledger rows (`pending`), read every row as it is before the
       claim, and claim the claimable ones for this worker until now + lease.
    3. Sort out the unclaimed by their rows as they are after the claim: duplicates, held under
       another worker's live lease (backed off until it ends), or not due (handed back).
    4. Run each kind: parse the subjects (a malformed one is invalid), then apply the in-database
       effect, or only lease the external one (`leased`, with its targets, for
       `lapse.processors.leased` to run and complete).
    5. Record the rest: applied or skipped; rescheduled when the business row is due later now;
       invalid work dead-lettered at once.
    6. Flush the ledger writes once: finishes, moves, transitions, outbox rows, duplicate counts.
    """
    result = scope.result
    # 1.
    unique, extra = collapse(events)
    if not unique:
        return result
    scope.writes.duplicates.update(extra)
    # 2.
    before, claimed = claim_rows(scope, unique)
    # 3.
    classify_unclaimed(scope, unique, claimed)
    # 4.
    runs = [run_kind(scope, kind, batch, before) for kind, batch in claimed_by_kind(scope, unique, claimed)]
    # 5.
    later = [moved for run in runs for moved in record_run(scope, run, before)]
    reschedule(scope, later, before)
    dead_letter_invalid(scope, [bad for run in runs for bad in run.invalid], before)
    # 6.
    result.duplicates = sum(scope.writes.duplicates.values())
    scope.writes.flush(scope.conn)
    return result


def collapse(events: Sequence[ExpiryEvent]) -> tuple[dict[str, ExpiryEvent], Counter[str]]:
    """One event per op key (the latest attempt wins); the rest are duplicates of this batch."""
    unique: dict[str, ExpiryEvent] = {}
    extra: Counter[str] = Counter()
    for event in events:
        seen = unique.get(event.op_key)
        if seen is None:
            unique[event.op_key] = event
        else:
            extra[event.op_key] += 1
            if event.attempt > seen.attempt:
                unique[event.op_key] = event
    return unique, extra


def claim_rows(scope: BatchScope, events: Mapping[str, ExpiryEvent]) -> tuple[dict[str, LedgerRow], set[str]]:
    """Create the missing ledger rows, read them all, claim the claimable: (rows before the
    claim, op keys claimed)."""
    insert_pending(scope.conn, list(events.values()), scope.now)
    before = read_rows(scope.conn, events)
    claimed = claim(scope.conn, list(events), scope.worker, scope.now, scope.now + scope.lease)
    return before, claimed


def classify_unclaimed(scope: BatchScope, unique: Mapping[str, ExpiryEvent], claimed: set[str]) -> None:
    """Sort events whose row could not be claimed, by the row's state as it is now (read after the
    claim, so a race lost to a concurrent worker shows its outcome):

    - done, an older attempt's wake-up, or a retry wake-up for another due time: a duplicate;
    - held under another worker's live lease: backed off until that lease ends;
    - waiting and not due: handed back through a delay tier with the ledger's due time.
    """
    rest = [key for key in unique if key not in claimed]
    rows = read_rows(scope.conn, rest) if rest else {}
    result = scope.result
    for key in rest:
        event, row = unique[key], rows[key]
        stale = row.state == RETRY_SCHEDULED and millis(event.due_at) != millis(row.due_at)
        if row.state in TERMINAL or event.attempt < row.attempt or stale:
            scope.writes.duplicates[key] += 1
        elif row.state == CLAIMED:
            result.conflicts.append(key)
            # A claimed row always has its lease end; the due time only keeps the type whole.
            result.backed_off.append(replace(event, due_at=row.claim_until or row.due_at))
        else:
            result.not_due.append(replace(event, due_at=row.due_at))


def claimed_by_kind(scope: BatchScope, unique: Mapping[str, ExpiryEvent], claimed: set[str]
                    ) -> Iterator[tuple[CleanupKind, list[ExpiryEvent]]]:
    by_kind: dict[str, list[ExpiryEvent]] = {}
    for key in claimed:
        by_kind.setdefault(unique[key].kind, []).append(unique[key])
    for name, batch in by_kind.items():
        yield scope.kinds[name], batch


def run_kind(scope: BatchScope, kind: CleanupKind, batch: list[ExpiryEvent],
             before: Mapping[str, LedgerRow]) -> KindRun:
    """Step 4 for one kind: parse, then apply in the database or lease the external effect.
    Subjects an external effect has no target for are already clean: recorded as skipped."""
    subjects: dict[str, Any] = {}
    invalid: list[Invalid] = []
    for event in batch:
        try:
            subjects[event.subject_id] = kind.parse_subject(event.subject_id)
        except ValueError as exc:
            invalid.append((event, str(exc)))
    parsed = [e for e in batch if e.subject_id in subjects]
    if kind.apply_in_db is not None:
        changed = kind.apply_in_db(scope.conn, list(subjects.values()), scope.now)
    else:
        lease_external(scope, external_effect(kind), parsed, subjects, before)
        changed = set()
    to_record = [(e, subjects[e.subject_id]) for e in parsed if e.op_key not in scope.result.targets]
    return KindRun(kind, to_record, changed, invalid)


def external_effect(kind: CleanupKind) -> ExternalEffect:
    if kind.external_effect is None:
        raise TypeError(f"cleanup kind {kind.name!r} has neither an in-database nor an external effect")
    return kind.external_effect


def lease_external(scope: BatchScope, effect: ExternalEffect, events: list[ExpiryEvent],
                   subjects: Mapping[str, Any], before: Mapping[str, LedgerRow]) -> None:
    """Keep the claims of subjects that still have a target (their business row still eligible
    and due): they go to `leased` with the row's values and the attempt the call runs (the ledger's
    count of attempts so far + 1), and the lease is recorded as a transition."""
    targets = effect.targets(scope.conn, list(subjects.values()), scope.now)
    for event in events:
        if event.subject_id in targets:
            row = before[event.op_key]
            scope.result.leased.append(event)
            scope.result.targets[event.op_key] = targets[event.subject_id]
            scope.result.attempts[event.op_key] = row.attempt + 1
            scope.writes.event_transition(event, row.state, CLAIMED, row.attempt)


def record_run(scope: BatchScope, run: KindRun, before: Mapping[str, LedgerRow]
               ) -> list[tuple[ExpiryEvent, datetime]]:
    """Step 5 for one kind: applied where the effect changed the subject, else skipped; returns
    the events whose business row turned out to be due later (with that due time)."""
    unchanged = [subject for e, subject in run.to_record if e.subject_id not in run.changed]
    moved = run.kind.not_yet_due(scope.conn, unchanged, scope.now) if unchanged else {}
    later: list[tuple[ExpiryEvent, datetime]] = []
    for event, _ in run.to_record:
        if event.subject_id in moved:
            later.append((event, moved[event.subject_id]))
            continue
        status = APPLIED if event.subject_id in run.changed else SKIPPED
        (scope.result.applied if status == APPLIED else scope.result.skipped).append(event.op_key)
        row = before[event.op_key]
        scope.writes.finish(event, row.state, status, row.attempt + 1)
    return later


def reschedule(scope: BatchScope, later: list[tuple[ExpiryEvent, datetime]],
               before: Mapping[str, LedgerRow]) -> None:
    """Work whose business row is still eligible but no longer due (a hold was extended after its
    event was produced) goes back to `pending` at the new due time, with a wake-up on a delay tier;
    skipping it would be terminal and the extended hold would never be cleaned up."""
    for event, due_at in later:
        attempt = before[event.op_key].attempt
        scope.writes.reschedule(event, due_at, attempt)
        wake_up(scope, event, due_at, attempt, source="reschedule")
        scope.result.rescheduled.append(event.op_key)


def dead_letter_invalid(scope: BatchScope, invalid: list[Invalid], before: Mapping[str, LedgerRow]) -> None:
    """Invalid work is dead-lettered at once: the ledger row, a transition, a DLQ record and an
    outcome, all in this transaction."""
    record_failures(scope, [
        FailedAttempt(event, EffectFailure(INVALID, reason), before[event.op_key].state,
                      before[event.op_key].attempt)
        for event, reason in invalid])


def dead_letter_events(scope: BatchScope, failed: list[Invalid]) -> BatchResult:
    """Dead-letter events whose cleanup cannot run at all (their own transaction failed), as
    `invalid` with the reason: ledger row, transition, DLQ record and outcome, in the scope's
    transaction. Rows already terminal are left alone (the event was a duplicate). A reason may
    quote outside input (a database error about a value): its control characters are escaped, so
    the reason itself cannot be what the database refuses."""
    before, claimed = claim_rows(scope, {e.op_key: e for e, _ in failed})
    dead_letter_invalid(scope, [(e, safe_text(r, REASON_LIMIT)) for e, r in failed if e.op_key in claimed],
                        before)
    scope.writes.flush(scope.conn)
    return scope.result
