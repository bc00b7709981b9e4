"""The fast path: due in-database work whose outcome is known to be `applied`, applied with its
ledger row written once, already finished.

The careful path (`lapse.processors.rules`) writes each ledger row three times — created `pending`
(or found so), claimed, finished — because it must serve redeliveries, retries, leases and races.
For two common cases its outcome is known before it starts, if the effect changes the business
row: an event of a kind with an in-database effect whose business row is present, of the event's
tenant, eligible and due, and whose op key has

- no ledger row, the event itself being due (a first delivery, `publish`): the careful path
  creates the row `pending` at the event's attempt and due time, claims it and finishes it
  `applied` at `event.attempt + 1`;
- a `pending` row, due by its own due time, unclaimed and unfinished (the sweep, `schedule_cleanup`
  and the reconciler create or bring forward such rows before their events are produced, and a
  replay releases dead letters so): the careful path claims it whatever the event's attempt or due
  time (a waiting row is claimable once due; only an unclaimable row makes an event a duplicate or
  early) and finishes it `applied` at `row.attempt + 1`.

Either way it records one transition `pending → applied` (no reason; the event's replay and
correlation ids) and one outcome (the event's fields, that attempt). This module writes exactly
that:

1. probe the ledger for the batch's in-database op keys (one primary-key select; rows with their
   bookkeeping columns, for an undo);
2. read the candidates' business rows (`kind.subject_rows`, one select per kind) and keep those
   present, of the event's tenant, eligible and due;
3. write their ledger rows finished (`applied`) before the effect, as the careful path claims
   its rows before the effect: first deliveries inserted with ON CONFLICT DO NOTHING RETURNING
   op_key (`insert_settled`), waiting rows moved by one conditional UPDATE … RETURNING that
   re-checks pending, due, unclaimed and unfinished (`settle_waiting`). A row a concurrent
   transaction created, claimed or finished is left out (its work is not ours, and no effect ran
   for it); one it is writing makes this statement wait for it; a waiting row that came back
   different from the probe (moved away and back between the probe and the UPDATE) is undone
   and left to the careful path. Locks are taken ledger first, business row second, in the
   careful path's order, so the two paths cannot deadlock each other;
4. run the effect (`kind.apply_in_db`, one statement per kind) on the rows written;
5. record the changed ones' transitions and outcomes in the scope's writes (flushed with the rest
   of the batch: one statement on PostgreSQL). The unchanged ones (the business row changed
   between the read and the effect — rare) are undone in this transaction, before anyone could
   see them — an inserted row deleted (`withdraw_settled`), a moved row put back `pending` as it
   was (`restore_waiting`) — and handed to the careful path, which decides them as it always does.

Everything else (external effects, a first delivery not due, a row in any other state or waiting
in the future, claimed, a malformed subject, no business row, another tenant's, not eligible, not
due by the business row) goes to the careful path untouched. So each op key's end state — ledger
row, business row, transitions, outcome, BatchResult classification — is what the careful path
alone would have left: the fast path only takes work whose careful outcome is `applied` and
writes that outcome's rows. In-batch duplicates of a first delivery are counted in its inserted
row; those of a waiting row are added by the flush, as the careful path adds them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from lapse.kernel.kinds import CleanupKind
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


def apply_fast_path(scope: BatchScope, unique: Mapping[str, ExpiryEvent], extra: Counter[str]) -> set[str]:
    """Apply and record, in the scope's transaction, the events of `unique` (one per op key) that
    qualify for the fast path (see the module docstring); returns their op keys, for the careful
    path to leave out. `extra` counts the batch's other deliveries of each op key: an inserted
    row carries them as its duplicates (moved out of the scope's duplicate counts into the result)."""
    in_db = [e.op_key for e in unique.values() if scope.kinds[e.kind].apply_in_db is not None]
    if not in_db:
        return set()
    probed = probe_rows(scope.conn, in_db)
    by_kind: dict[str, list[ExpiryEvent]] = {}
    for key in in_db:
        event, found = unique[key], probed.get(key)
        if settles_waiting(found, scope.now) if found is not None else event.due_at <= scope.now:
            by_kind.setdefault(event.kind, []).append(event)
    candidates = {name: ready(scope, scope.kinds[name], batch) for name, batch in by_kind.items()}
    fresh = [e for batch in candidates.values() for e, _ in batch if e.op_key not in probed]
    waiting = [e.op_key for batch in candidates.values() for e, _ in batch if e.op_key in probed]
    if not fresh and not waiting:
        return set()
    # 3. Ledger rows first: the attempt each row written finishes at.
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
    # 4. The effect, on the rows written.
    settled: list[ExpiryEvent] = []
    withdrawn: list[str] = []
    for name, batch in candidates.items():
        ours = [(e, subject) for e, subject in batch if e.op_key in attempts]
        apply = scope.kinds[name].apply_in_db
        if not ours or apply is None:
            continue
        changed = apply(scope.conn, [subject for _, subject in ours], scope.now)
        for event, _ in ours:
            if event.subject_id in changed:
                settled.append(event)
            elif event.op_key in inserted:
                withdrawn.append(event.op_key)
            else:
                undo[event.op_key] = probed[event.op_key].updated_at
    # 5.
    withdraw_settled(scope.conn, withdrawn, scope.now)
    restore_waiting(scope.conn, undo, scope.now)
    for event in settled:
        scope.writes.settled(event, APPLIED, attempts[event.op_key])
        scope.result.applied.append(event.op_key)
        if event.op_key in inserted:
            scope.result.duplicates += scope.writes.duplicates.pop(event.op_key, 0)
    return {event.op_key for event in settled}


def ready(scope: BatchScope, kind: CleanupKind, batch: list[ExpiryEvent]) -> list[tuple[ExpiryEvent, Any]]:
    """The events of `batch` (one kind) with their parsed subjects whose business row is present,
    of the event's tenant (when the table has one), eligible and due at the scope's now: the work
    whose careful outcome is `applied` if the effect changes it. The rest are left out."""
    subjects: dict[str, Any] = {}
    for event in batch:
        try:
            subjects[event.subject_id] = kind.parse_subject(event.subject_id)
        except ValueError:
            continue  # invalid: the careful path dead-letters it
    present = kind.subject_rows(scope.conn, list(subjects.values()))
    tenants = kind.has_tenant
    out = []
    for event in batch:
        row = present.get(event.subject_id)
        if (row is not None and row.eligible and due_by(row.due_at, scope.now)
                and (not tenants or row.tenant == event.tenant)):
            out.append((event, subjects[event.subject_id]))
    return out


def due_by(due_at: Any, now: datetime) -> bool:
    """Whether a business row's due time has come. A due column this cannot compare with an instant
    (a naive timestamp, a date) counts as due: the effect's own condition then decides, and an
    unchanged row goes to the careful path."""
    try:
        return bool(due_at <= now)
    except TypeError:
        return True
