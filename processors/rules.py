"""The cleanup rules for one batch, as plain functions over the batch's scope: the careful path.

`apply_batch` runs in the transaction its caller began and never touches Kafka, so it is tested on
a real database with no broker. The arguments: docs/design/processing.md, "The careful path".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from lapse.kernel.kinds import CleanupKind, ExternalEffect, SubjectRow
from lapse.kernel.ledger import (
    APPLIED,
    CLAIMED,
    PARKED,
    PENDING,
    RETRY_SCHEDULED,
    SKIPPED,
    TERMINAL,
    ExpiryEvent,
    LedgerRow,
    bring_forward,
    claim,
    insert_pending,
    millis,
    read_rows,
)
from lapse.kernel.logs import get_logger
from lapse.kernel.text import one_line
from lapse.processors.brakes import count_usage, hold, pause_spent, sort_out
from lapse.processors.failures import AMBIGUOUS, INVALID, EffectFailure
from lapse.processors.fast_path import apply_fast_path
from lapse.processors.retries import FailedAttempt, record_failures, wake_up
from lapse.processors.scope import BatchResult, BatchScope
from lapse.processors.shadow import shadow

Invalid = tuple[ExpiryEvent, str]  # an event whose work can never run, and why
REASON_LIMIT = 500  # characters of a dead-letter reason written to the ledger
TENANT_SHOWN = 64  # characters of each tenant a tenant-mismatch reason quotes
DUE_BY_SUBJECT = "brought forward: the business row is due sooner than the event said"
RECHECK_SOURCE = "recheck"  # the source of the wake-up that rechecks a subject that did not exist
log = get_logger("processor")


@dataclass(frozen=True)
class KindRun:
    """One kind's claimed events after step 4: those left to record (not leased) with their
    parsed subjects, the subjects (by `subject_key`) the in-database effect changed, the invalid
    ones, and the business rows that existed before the effect (a subject without one waits for it)."""

    kind: CleanupKind
    to_record: list[tuple[ExpiryEvent, Any]]
    changed: set[str]
    invalid: list[Invalid]
    present: Mapping[str, SubjectRow]


def apply_batch(scope: BatchScope, events: Sequence[ExpiryEvent], *, fast_path: bool = True) -> BatchResult:
    """Claim, apply and record one batch of decoded events in the scope's transaction.

    Without `fast_path` every event that goes on takes the careful path (the tests compare the two).

    1. Collapse to one event per op key (the latest attempt wins); read the business rows once, and
       set aside events whose tenant is not their row's (poison: they never create or claim a
       ledger row; `set_aside_forged`).
    2. Brakes: hold what a pause, an undeclared kind or a spent budget stops, shadow a shadow-mode
       kind's work (`processors.brakes`, `processors.shadow`); the rest goes on, budgets charged.
    3. Fast path: work whose outcome is known (`apply_fast_path`); steps 4 to 7 are the careful
       path, for the rest.
    4. Claim: create the missing ledger rows, read them, bring forward rows waiting for no reason
       their business row gives, claim the claimable.
    5. Sort out the unclaimed: duplicates, backed off under another lease, or not due.
    6. Run each kind: parse, check tenants, apply in the database or lease the external effect.
    7. Record the rest: applied, skipped, rescheduled, waiting for its business row, or invalid.
    8. Count what the budgets let through, and flush the ledger writes once.
    """
    # Step 1: collapse, the business rows, forged tenants set aside.
    unique, extra = collapse(events)
    if not unique:
        return scope.result
    scope.writes.duplicates.update(extra)
    present = subjects_present(scope, unique)
    unique = set_aside_forged(scope, unique, present)
    # Step 2: the brakes.
    unique = park_braked(scope, unique)
    # Step 3: the fast path.
    fast = apply_fast_path(scope, unique, extra, present) if fast_path and unique else set()
    unique = {key: event for key, event in unique.items() if key not in fast}
    if not unique:
        return finish_batch(scope)
    # Step 4: claim.
    before, claimed = claim_rows(scope, unique)
    # Step 5: sort out the unclaimed.
    classify_unclaimed(scope, unique, claimed)
    # Step 6: run each kind.
    runs = [run_kind(scope, kind, batch, before, present.get(kind.name, {}))
            for kind, batch in claimed_by_kind(scope, unique, claimed)]
    # Step 7: record the rest.
    later, missing = [], []
    for run in runs:
        moved, absent = record_run(scope, run, before)
        later += moved
        missing += [(event, run.kind) for event in absent]
    reschedule(scope, later, before)
    await_subjects(scope, missing, before)
    dead_letter_invalid(scope, [bad for run in runs for bad in run.invalid], before)
    # Step 8: count the budgets, flush.
    return finish_batch(scope)


def park_braked(scope: BatchScope, unique: Mapping[str, ExpiryEvent]) -> dict[str, ExpiryEvent]:
    """Step 2: park what the brakes stop (held, shadowed), pause a kind whose budget this batch
    spent, sort out the stopped events that could not be parked (duplicates, not due, under
    another lease); returns the events that go on."""
    stopped = sort_out(scope, unique)
    parked = hold(scope, stopped.held) | shadow(scope, stopped.shadowed)
    pause_spent(scope, stopped, parked)
    braked = {key: event for key, (event, _) in stopped.held.items()} | {e.op_key: e for e in stopped.shadowed}
    if braked:
        classify_unclaimed(scope, braked, parked)
    return stopped.go


def finish_batch(scope: BatchScope) -> BatchResult:
    """Step 8: record the budgets' usage, count the duplicates, flush the writes once."""
    count_usage(scope, scope.lease)
    scope.result.duplicates += sum(scope.writes.duplicates.values())
    scope.writes.flush(scope.conn)
    return scope.result


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


def subjects_present(scope: BatchScope, events: Mapping[str, ExpiryEvent]) -> dict[str, Mapping[str, SubjectRow]]:
    """Kind name → the business rows of its events' subjects that exist (one read per declared
    kind); a subject that does not parse is left out (step 6 dead-letters it)."""
    by_kind: dict[str, dict[str, Any]] = {}
    for event in events.values():
        if event.kind not in scope.kinds:
            continue  # undeclared: held by the brakes
        try:
            by_kind.setdefault(event.kind, {})[event.subject_key] = scope.kinds[event.kind].parse_key(
                event.subject_key)
        except ValueError:
            continue
    return {name: scope.kinds[name].subject_rows(scope.conn, list(subjects.values()))
            for name, subjects in by_kind.items()}


def set_aside_forged(scope: BatchScope, events: Mapping[str, ExpiryEvent],
                     present: Mapping[str, Mapping[str, SubjectRow]]) -> dict[str, ExpiryEvent]:
    """Events whose tenant is not their business row's are forged or mistaken: they go to the DLQ as
    poison (`BatchResult.forged`) before any ledger row is made or claimed for them, so the real
    subject's operation is never occupied by them. An op key whose ledger row already carries the
    event's tenant (made before it could be checked: while its kind was undeclared, or by an older
    version) is the business row's work: it goes on under the business row's tenant. Returns the
    events that go on."""
    mismatched: dict[str, tuple[ExpiryEvent, str, str]] = {}
    for key, event in events.items():
        business = present.get(event.kind, {}).get(event.subject_key)
        if business is None or business.tenant == event.tenant:
            continue  # the common case, decided without a look at the kind
        kind = scope.kinds.get(event.kind)
        mismatch = next(tenant_mismatches(kind, [event], present[event.kind]), None) if kind else None
        if mismatch is not None:
            mismatched[key] = (*mismatch, business.tenant)
    if not mismatched:
        return dict(events)
    rows = read_rows(scope.conn, mismatched)
    kept = {key: event for key, event in events.items() if key not in mismatched}
    for key, (event, reason, tenant) in mismatched.items():
        row = rows.get(key)
        if row is not None and row.tenant == event.tenant:
            kept[key] = event._replace(tenant=tenant)
            log.warning("tenant corrected from the business row for work recorded before it was checked",
                        extra={"op_key": key, "correlation_id": event.correlation_id})
        else:
            scope.result.forged.append((event, reason))
    return kept


def claim_rows(scope: BatchScope, events: Mapping[str, ExpiryEvent]) -> tuple[dict[str, LedgerRow], set[str]]:
    """Create the missing ledger rows, read them all, claim the claimable: (rows before the
    claim, op keys claimed)."""
    insert_pending(scope.conn, list(events.values()), scope.now)
    before = read_rows(scope.conn, events)
    early = held_back_by_event(scope, events, before)
    for row in bring_forward(scope.conn, early, scope.now):
        scope.writes.transition(row.op_key, PENDING, PENDING, row.attempt, reason=DUE_BY_SUBJECT,
                                replay_id=row.replay_id, correlation_id=row.correlation_id)
    claimed = claim(scope.conn, list(events), scope.worker, scope.now, scope.now + scope.lease)
    return before, claimed


def held_back_by_event(scope: BatchScope, events: Mapping[str, ExpiryEvent], before: Mapping[str, LedgerRow]
                       ) -> list[str]:
    """Op keys whose row is `pending` past now for no reason its business row gives (due sooner,
    no longer eligible, or missing while the row waits longer than one recheck); only rows waiting
    in the future are looked up."""
    waiting: dict[str, list[ExpiryEvent]] = {}
    for key, event in events.items():
        row = before.get(key)
        if row is not None and row.state == PENDING and row.due_at > scope.now:
            waiting.setdefault(event.kind, []).append(event)
    early: list[str] = []
    for name, batch in waiting.items():
        kind = scope.kinds[name]
        subjects = []
        for event in batch:
            try:
                subjects.append(kind.parse_key(event.subject_key))
            except ValueError:
                continue  # no business row can match: as for a missing one (dead-lettered when claimed)
        rows = kind.subject_rows(scope.conn, subjects)
        recheck = recheck_at(kind, scope.now)
        for e in batch:
            r, waits_until = rows.get(e.subject_key), before[e.op_key].due_at
            if (waits_until > recheck) if r is None else (not r.eligible or r.due_at < waits_until):
                early.append(e.op_key)
    return early


def classify_unclaimed(scope: BatchScope, unique: Mapping[str, ExpiryEvent], claimed: set[str]) -> None:
    """Sort events whose row could not be claimed (or parked) by the row as it is after the claim:
    a duplicate, backed off until another worker's lease ends, or handed back not due."""
    rest = [key for key in unique if key not in claimed]
    rows = read_rows(scope.conn, rest) if rest else {}
    result = scope.result
    for key in rest:
        event, row = unique[key], rows[key]
        stale = row.state == RETRY_SCHEDULED and millis(event.due_at) != millis(row.due_at)
        # A parked row waits in the ledger for its release, which brings its own event.
        if row.state in TERMINAL or row.state in PARKED or event.attempt < row.attempt or stale:
            scope.writes.duplicates[key] += 1
        elif row.state == CLAIMED:
            result.conflicts.append(key)
            # A claimed row always has its lease end; the due time only keeps the type whole.
            result.backed_off.append(event._replace(due_at=row.claim_until or row.due_at))
        else:
            result.not_due.append(event._replace(due_at=row.due_at))


def claimed_by_kind(scope: BatchScope, unique: Mapping[str, ExpiryEvent], claimed: set[str]
                    ) -> Iterator[tuple[CleanupKind, list[ExpiryEvent]]]:
    by_kind: dict[str, list[ExpiryEvent]] = {}
    for key in claimed:
        by_kind.setdefault(unique[key].kind, []).append(unique[key])
    for name, batch in by_kind.items():
        yield scope.kinds[name], batch


def run_kind(scope: BatchScope, kind: CleanupKind, batch: list[ExpiryEvent],
             before: Mapping[str, LedgerRow], present: Mapping[str, SubjectRow]) -> KindRun:
    """Step 6 for one kind: parse, then apply in the database or lease the external effect, with
    the business rows step 4 read (`present`: their tenants were checked there). Subjects an
    external effect has no target for are already clean: recorded as skipped."""
    subjects: dict[str, Any] = {}
    invalid: list[Invalid] = []
    for event in batch:
        try:
            subjects[event.subject_key] = kind.parse_key(event.subject_key)
        except ValueError as exc:
            invalid.append((event, str(exc)))
    parsed = [e for e in batch if e.subject_key in subjects]
    handled: set[str] = set()
    if kind.apply_in_db is not None:
        changed = kind.apply_in_db(scope.conn, list(subjects.values()), scope.now)
    else:
        handled = lease_external(scope, kind, parsed, subjects, before)
        changed = set()
    to_record = [(e, subjects[e.subject_key]) for e in parsed if e.op_key not in handled]
    return KindRun(kind, to_record, changed, invalid, present)


def tenant_mismatches(kind: CleanupKind, batch: list[ExpiryEvent], present: Mapping[str, SubjectRow]
                      ) -> Iterator[Invalid]:
    """Events whose tenant is not their business row's, with a reason naming both (each cut to
    TENANT_SHOWN characters): invalid, so the business row is never touched on their word. A kind
    whose table has no tenant column reads a constant and checks nothing."""
    if not kind.has_tenant:
        return
    for event in batch:
        row = present.get(event.subject_key)
        if row is not None and row.tenant != event.tenant:
            yield event, (f"tenant mismatch: the event says {one_line(event.tenant, TENANT_SHOWN, escape=True)!r}, "
                          f"the business row says {one_line(row.tenant, TENANT_SHOWN, escape=True)!r}")


def external_effect(kind: CleanupKind) -> ExternalEffect:
    if kind.external_effect is None:
        raise TypeError(f"cleanup kind {kind.name!r} has neither an in-database nor an external effect")
    return kind.external_effect


def lease_external(scope: BatchScope, kind: CleanupKind, events: list[ExpiryEvent],
                   subjects: Mapping[str, Any], before: Mapping[str, LedgerRow]) -> set[str]:
    """Lease the subjects that still have a target: to `leased` with the row's values and the
    attempt the call runs; a takeover of a non-idempotent effect, or of a last attempt, is recorded
    as a failure instead (docs/design/processing.md, "Leases"). Returns the op keys handled here;
    the rest have no target and are recorded as skipped."""
    targets = external_effect(kind).targets(scope.conn, list(subjects.values()), scope.now)
    lost: list[FailedAttempt] = []
    for event in events:
        if event.subject_key in targets:
            row = before[event.op_key]
            taken_over = row.state == CLAIMED
            if taken_over and (not kind.idempotent_effect or row.attempt + 1 >= kind.max_attempts):
                lost.append(FailedAttempt(event, EffectFailure(
                    AMBIGUOUS, f"the lease of {row.claim_owner} ran out while its call may have run"),
                    CLAIMED, row.attempt))
                continue
            attempt = row.attempt + taken_over  # the attempts so far, a lost one included
            scope.result.leased.append(event)
            scope.result.targets[event.op_key] = targets[event.subject_key]
            scope.result.attempts[event.op_key] = attempt + 1
            scope.writes.event_transition(event, row.state, CLAIMED, attempt)
    record_failures(scope, lost)
    return {event.op_key for event in events if event.subject_key in targets}


def record_run(scope: BatchScope, run: KindRun, before: Mapping[str, LedgerRow]
               ) -> tuple[list[tuple[ExpiryEvent, datetime]], list[ExpiryEvent]]:
    """Step 5 for one kind: applied where the effect changed the subject, else skipped; returns
    the events whose business row turned out to be due later (with that due time), and those
    whose business row does not exist (yet)."""
    unchanged = [subject for e, subject in run.to_record if e.subject_key not in run.changed]
    moved = run.kind.not_yet_due(scope.conn, unchanged, scope.now) if unchanged else {}
    later: list[tuple[ExpiryEvent, datetime]] = []
    missing: list[ExpiryEvent] = []
    for event, _ in run.to_record:
        if event.subject_key in moved:
            later.append((event, moved[event.subject_key]))
            continue
        if event.subject_key not in run.changed and event.subject_key not in run.present:
            missing.append(event)
            continue
        status = APPLIED if event.subject_key in run.changed else SKIPPED
        (scope.result.applied if status == APPLIED else scope.result.skipped).append(event.op_key)
        row = before[event.op_key]
        scope.writes.finish(event, row.state, status, row.attempt + 1)
    return later, missing


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


def await_subjects(scope: BatchScope, missing: list[tuple[ExpiryEvent, CleanupKind]],
                   before: Mapping[str, LedgerRow]) -> None:
    """Work whose business row does not exist (yet) waits for it: back to `pending` until the next
    recheck, each counting an attempt, and `skipped` after the kind's `max_attempts`."""
    for event, kind in missing:
        row = before[event.op_key]
        attempt = row.attempt + 1
        if attempt >= kind.max_attempts:
            scope.writes.finish(event, row.state, SKIPPED, attempt,
                                reason=f"no business row after {attempt} checks")
            scope.result.skipped.append(event.op_key)
            continue
        due_at = recheck_at(kind, scope.now)
        scope.writes.reschedule(event, due_at, attempt,
                                reason=f"waiting: no business row yet; rechecked at {due_at.isoformat()}")
        wake_up(scope, event, due_at, attempt, source=RECHECK_SOURCE)
        scope.result.rescheduled.append(event.op_key)


def recheck_at(kind: CleanupKind, now: datetime) -> datetime:
    """When work whose business row did not exist looks for it again: now + the kind's
    `retry_cap_s`, the longest any of its retries waits."""
    return now + timedelta(seconds=kind.retry_cap_s)


def dead_letter_invalid(scope: BatchScope, invalid: list[Invalid], before: Mapping[str, LedgerRow]) -> None:
    """Invalid work is dead-lettered at once: the ledger row, a transition, a DLQ record and an
    outcome, all in this transaction."""
    record_failures(scope, [
        FailedAttempt(event, EffectFailure(INVALID, reason), before[event.op_key].state,
                      before[event.op_key].attempt)
        for event, reason in invalid])


def dead_letter_events(scope: BatchScope, failed: list[Invalid]) -> BatchResult:
    """Dead-letter events whose own transaction failed as `invalid` with the reason (escaped, so
    it cannot be what the database refuses), in the scope's transaction; terminal rows are left alone."""
    before, claimed = claim_rows(scope, {e.op_key: e for e, _ in failed})
    dead_letter_invalid(scope, [(e, one_line(r, REASON_LIMIT, escape=True)) for e, r in failed if e.op_key in claimed],
                        before)
    scope.writes.flush(scope.conn)
    return scope.result
