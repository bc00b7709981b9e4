"""The cleanup rules for one batch, as plain functions over a database connection.

`apply_batch` runs inside the caller's transaction: it creates missing ledger rows, claims the
claimable ones, runs each kind's in-database effect, and records transitions and outbox rows. It
never touches Kafka, so it is tested against a real database with no broker.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy import Connection

from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import APPLIED, CLAIMED, PENDING, RETRY_SCHEDULED, SKIPPED, TERMINAL, ExpiryEvent
from lapse.kernel.ledger_queries import (
    insert_outbox,
    insert_pending,
    millis,
    outbox_row,
    record_transitions,
    transition,
)
from lapse.processors import queries
from lapse.processors.failures import INVALID, EffectFailure
from lapse.processors.payloads import outcome_payload
from lapse.processors.retries import FailedAttempt, record_failures, wakeup_row


@dataclass(frozen=True)
class Topics:
    """Where the rules send records: outcomes, dead letters, and retry wake-ups (a delay tier
    `delay_prefix + tier`, forwarded to `expiry` when due)."""

    outcomes: str
    dlq: str
    expiry: str = "lapse.expiry"
    delay_prefix: str = "lapse.delay."
    tiers: tuple[tuple[str, int], ...] = (("30s", 30), ("2m", 120), ("10m", 600), ("1h", 3600))


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
    retried: list[str] = field(default_factory=list)
    rescheduled: list[str] = field(default_factory=list)  # still eligible, due later than thought
    backed_off: list[ExpiryEvent] = field(default_factory=list)  # due_at = the other lease's end
    targets: dict[str, str] = field(default_factory=dict)  # leased op key → effect target

    def absorb(self, other: BatchResult) -> None:
        """Add another result's counts and keys to this one (results of one batch, split)."""
        for name, value in vars(other).items():
            mine = getattr(self, name)
            if isinstance(mine, list):
                mine.extend(value)
            elif isinstance(mine, dict):
                mine.update(value)
            else:
                setattr(self, name, mine + value)

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
    rng: random.Random | None = None,
) -> BatchResult:
    """Claim, apply and record one batch of decoded events in the caller's transaction.

    Events must name known kinds (the decoder dead-letters the others before this point).
    Kinds with an external effect are only claimed here (lease until now + `lease`) and returned
    in `leased` with their targets; `lapse.processors.leased` runs and completes them."""
    result = BatchResult()
    rng = rng or random.Random()
    unique, extra = collapse(events)
    if not unique:
        return result
    insert_pending(conn, list(unique.values()), now)
    before = queries.read_states(conn, unique)
    claimed = queries.claim(conn, list(unique), worker, now, now + lease)
    duplicates = Counter(extra)
    classify_unclaimed(conn, unique, claimed, result, duplicates)
    result.duplicates = sum(duplicates.values())

    by_kind: dict[str, list[ExpiryEvent]] = {}
    for key in claimed:
        by_kind.setdefault(unique[key].kind, []).append(unique[key])

    transitions: list[dict] = []
    outbox: list[dict] = []
    invalid: list[tuple[ExpiryEvent, str]] = []
    reschedules: list[tuple[ExpiryEvent, datetime]] = []
    for kind_name, batch in by_kind.items():
        kind = kinds[kind_name]
        subjects: dict[str, object] = {}
        for event in batch:
            try:
                subjects[event.subject_id] = kind.parse_subject(event.subject_id)
            except ValueError as exc:
                invalid.append((event, str(exc)))
        if kind.apply_in_db is None:
            lease_external(conn, kind, batch, subjects, result, before=before, worker=worker,
                           now=now, transitions=transitions)
            changed: set[str] = set()  # subjects without a target are already clean: skipped
        else:
            changed = kind.apply_in_db(conn, list(subjects.values()), now)
        unchanged = [subjects[e.subject_id] for e in batch if e.subject_id in subjects
                     and e.subject_id not in changed and e.op_key not in result.targets]
        moved = kind.not_yet_due(conn, unchanged, now) if unchanged else {}
        for event in batch:
            if event.subject_id not in subjects or event.op_key in result.targets:
                continue
            if event.subject_id in moved:
                reschedules.append((event, moved[event.subject_id]))
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
    if reschedules:
        reschedule(conn, reschedules, result, topics=topics, worker=worker, now=now,
                   before=before, transitions=transitions, outbox=outbox)
    if invalid:
        dead_letter_invalid(conn, invalid, result, kinds=kinds, topics=topics, worker=worker,
                            now=now, before=before, positions=positions or {},
                            transitions=transitions, outbox=outbox, rng=rng)
    record_transitions(conn, transitions)
    insert_outbox(conn, outbox)
    queries.add_duplicates(conn, duplicates)
    return result


def reschedule(conn: Connection, moved: list[tuple[ExpiryEvent, datetime]], result: BatchResult, *,
               topics, worker, now, before, transitions, outbox) -> None:
    """Work whose business row is still eligible but no longer due (a hold was extended after its
    event was produced) goes back to `pending` at the new due time, with a wake-up on a delay tier;
    skipping it would be terminal and the extended hold would never be cleaned up."""
    rows = []
    for event, due_at in moved:
        attempt = before[event.op_key][1]
        rows.append({"op_key": event.op_key, "state": PENDING, "attempt": attempt, "due_at": due_at,
                     "failure_class": None, "failure": None, "finished_at": None})
        transitions.append(transition(
            event.op_key, CLAIMED, PENDING, attempt, worker, now,
            reason=f"rescheduled: not due until {due_at.isoformat()}",
            replay_id=event.replay_id, correlation_id=event.correlation_id))
        outbox.append(wakeup_row(event, due_at, attempt, now, topics=topics, source="reschedule"))
        result.rescheduled.append(event.op_key)
    queries.finish_with_failure(conn, rows, worker, now)


def dead_letter_events(conn: Connection, failed: list[tuple[ExpiryEvent, str]], *, kinds, topics,
                       worker: str, now: datetime, lease: timedelta,
                       positions: dict | None = None, rng: random.Random | None = None) -> BatchResult:
    """Dead-letter events whose cleanup cannot run at all (their own transaction failed), as
    `invalid` with the reason: ledger row, transition, DLQ record and outcome, in one transaction.
    Rows already terminal are left alone (the event was a duplicate)."""
    result = BatchResult()
    events = {e.op_key: e for e, _ in failed}
    insert_pending(conn, list(events.values()), now)
    before = queries.read_states(conn, events)
    claimed = queries.claim(conn, list(events), worker, now, now + lease)
    transitions: list[dict] = []
    outbox: list[dict] = []
    dead_letter_invalid(conn, [(e, r) for e, r in failed if e.op_key in claimed], result,
                        kinds=kinds, topics=topics, worker=worker, now=now, before=before,
                        positions=positions or {}, transitions=transitions, outbox=outbox,
                        rng=rng or random.Random())
    record_transitions(conn, transitions)
    insert_outbox(conn, outbox)
    return result


def classify_unclaimed(conn: Connection, unique: dict[str, ExpiryEvent], claimed: set[str],
                       result: BatchResult, duplicates: Counter) -> None:
    """Sort events whose row could not be claimed, by the row's state as it is now (read after the
    claim, so a race lost to a concurrent worker shows its outcome):

    - done, an older attempt's wake-up, or a retry wake-up for another due time: a duplicate;
    - held under another worker's live lease: backed off until that lease ends;
    - waiting and not due: handed back through a delay tier with the ledger's due time.
    """
    rest = [key for key in unique if key not in claimed]
    states = queries.read_states(conn, rest) if rest else {}
    for key in rest:
        event = unique[key]
        state, attempt, due_at, _owner, claim_until, *_ = states[key]
        stale = state == RETRY_SCHEDULED and millis(event.due_at) != millis(due_at)
        if state in TERMINAL or event.attempt < attempt or stale:
            duplicates[key] += 1
        elif state == CLAIMED:
            result.conflicts.append(key)
            result.backed_off.append(replace(event, due_at=claim_until))
        else:
            result.not_due.append(replace(event, due_at=due_at))


def lease_external(conn, kind: CleanupKind, batch: list[ExpiryEvent], subjects: dict, result,
                   *, before, worker, now, transitions) -> None:
    """Keep the claims of subjects that still have a target: they go to `leased` with it, and the
    lease is recorded as a transition. The others are already clean (the caller skips them)."""
    targets = kind.external_effect.targets(conn, list(subjects.values()), now)
    for event in batch:
        if event.subject_id in targets:
            result.leased.append(event)
            result.targets[event.op_key] = targets[event.subject_id]
            transitions.append(transition(
                event.op_key, before[event.op_key][0], CLAIMED, before[event.op_key][1], worker, now,
                replay_id=event.replay_id, correlation_id=event.correlation_id))


def dead_letter_invalid(conn, invalid, result, *, kinds, topics, worker, now, before, positions,
                        transitions, outbox, rng) -> None:
    """Invalid work is dead-lettered at once: the ledger row, a transition, a DLQ record and an
    outcome, all in this transaction."""
    failed = [FailedAttempt(event, EffectFailure(INVALID, reason), before[event.op_key][0],
                            before[event.op_key][1], positions.get(event.op_key))
              for event, reason in invalid]
    _, dead = record_failures(conn, failed, kinds=kinds, topics=topics, worker=worker, now=now,
                              rng=rng, transitions=transitions, outbox=outbox)
    result.dead_lettered.extend(dead)
