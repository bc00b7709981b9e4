"""The fast path: due in-database work whose outcome can only be `applied`, with its ledger row
written once, already settled, instead of the careful path's three writes.

What qualifies, and why the end state is the careful path's: docs/design/processing.md, "The fast path".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from lapse.kernel.kinds import CleanupKind, SubjectRow
from lapse.kernel.ledger import (
    APPLIED,
    ExpiryEvent,
    insert_settled,
    probe_rows,
    restore_waiting,
    settle_waiting,
    settled_row,
    settles_waiting,
    withdraw_settled,
)
from lapse.processors.scope import BatchScope


def apply_fast_path(scope: BatchScope, unique: Mapping[str, ExpiryEvent], extra: Counter[str],
                    present: Mapping[str, Mapping[str, SubjectRow]]) -> set[str]:
    """Apply and record, in the scope's transaction, the events of `unique` (one per op key) that
    qualify; returns their op keys, for the careful path to leave out. `extra` counts the batch's
    other deliveries of each op key (an inserted row carries them as its duplicates); `present`
    holds each kind's business rows as the batch read them (`rules.subjects_present`).

    1. Probe the ledger for the in-database op keys.
    2. Keep the events whose business row is present, of their tenant, eligible and due.
    3. Write their ledger rows settled (`applied`), before the effect.
    4. Run the effect on the rows written.
    5. Record the changed ones; undo the unchanged ones and leave them to the careful path.
    """
    # Step 1: probe the ledger.
    in_db = [e.op_key for e in unique.values() if scope.kinds[e.kind].apply_in_db is not None]
    if not in_db:
        return set()
    probed = probe_rows(scope.conn, in_db)
    by_kind: dict[str, list[ExpiryEvent]] = {}
    for key in in_db:
        event, found = unique[key], probed.get(key)
        if settles_waiting(found, scope.now) if found is not None else event.due_at <= scope.now:
            by_kind.setdefault(event.kind, []).append(event)
    # Step 2: the business rows.
    candidates = {name: ready(scope, scope.kinds[name], batch, present.get(name, {}))
                  for name, batch in by_kind.items()}
    fresh = [e for batch in candidates.values() for e, _ in batch if e.op_key not in probed]
    waiting = [e.op_key for batch in candidates.values() for e, _ in batch if e.op_key in probed]
    if not fresh and not waiting:
        return set()
    # Step 3: ledger rows first, with the attempt each row written settles at.
    inserted = insert_settled(scope.conn, [settled_row(e, APPLIED, e.attempt + 1, extra[e.op_key], scope.now)
                                           for e in fresh]) if fresh else set()
    attempts = {key: unique[key].attempt + 1 for key in inserted}
    undo: dict[str, datetime] = {}
    for key, row in settle_waiting(scope.conn, waiting, scope.now).items():
        before = probed[key]
        if row == replace(before.row, state=APPLIED, attempt=before.row.attempt + 1):
            attempts[key] = row.attempt
        else:
            undo[key] = before.updated_at  # not the row probed: the careful path reads it afresh
    # Step 4: the effect, on the rows written.
    settled: list[ExpiryEvent] = []
    withdrawn: list[str] = []
    for name, batch in candidates.items():
        ours = [(e, subject) for e, subject in batch if e.op_key in attempts]
        apply = scope.kinds[name].apply_in_db
        if not ours or apply is None:
            continue
        changed = apply(scope.conn, [subject for _, subject in ours], scope.now)
        for event, _ in ours:
            if event.subject_key in changed:
                settled.append(event)
            elif event.op_key in inserted:
                withdrawn.append(event.op_key)
            else:
                undo[event.op_key] = probed[event.op_key].updated_at
    # Step 5: record the changed, undo the unchanged.
    withdraw_settled(scope.conn, withdrawn, scope.now)
    restore_waiting(scope.conn, undo, scope.now)
    for event in settled:
        scope.writes.settled(event, APPLIED, attempts[event.op_key])
        scope.result.applied.append(event.op_key)
        if event.op_key in inserted:
            scope.result.duplicates += scope.writes.duplicates.pop(event.op_key, 0)
    return {event.op_key for event in settled}


def ready(scope: BatchScope, kind: CleanupKind, batch: list[ExpiryEvent], present: Mapping[str, SubjectRow]
          ) -> list[tuple[ExpiryEvent, Any]]:
    """The events of `batch` (one kind), with their parsed subjects, whose business row is present
    (in `present`, as the batch read it), of the event's tenant (when the table has one), eligible
    and due at the scope's now."""
    subjects: dict[str, Any] = {}
    for event in batch:
        try:
            subjects[event.subject_key] = kind.parse_key(event.subject_key)
        except ValueError:
            continue  # invalid: the careful path dead-letters it
    tenants = kind.has_tenant
    out = []
    for event in batch:
        row = present.get(event.subject_key)
        if (row is not None and row.eligible and due_by(row.due_at, scope.now)
                and (not tenants or row.tenant == event.tenant)):
            out.append((event, subjects[event.subject_key]))
    return out


def due_by(due_at: Any, now: datetime) -> bool:
    """Whether a business row's due time has come. A due column this cannot compare with an instant
    (a naive timestamp, a date) counts as due: the effect's own condition then decides, and an
    unchanged row goes to the careful path."""
    try:
        return bool(due_at <= now)
    except TypeError:
        return True
