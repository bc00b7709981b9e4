"""The fast path: due in-database work whose outcome can only be `applied`, with its ledger row
written once, already settled, instead of the careful path's three writes.

What qualifies, and why the end state is the careful path's: docs/design/processing.md, "The fast path".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from lapse.kernel.kinds import CleanupKind, SubjectRow
from lapse.kernel.ledger import ExpiryEvent, record_settled, settle
from lapse.processors.scope import BatchScope


def apply_fast_path(scope: BatchScope, unique: Mapping[str, ExpiryEvent], extra: Counter[str],
                    present: Mapping[str, Mapping[str, SubjectRow]]) -> set[str]:
    """Apply and record, in the scope's transaction, the events of `unique` (one per op key) that
    qualify; returns their op keys, for the careful path to leave out. `extra` counts the batch's
    other deliveries of each op key (an inserted row carries them as its duplicates); `present`
    holds each kind's business rows as the batch read them (`rules.subjects_present`).

    1. Keep the in-database work whose business row is present, of its tenant, eligible and due.
    2. Write its ledger rows settled (`applied`), before the effect (`settle`: waiting rows moved,
       first deliveries inserted; a row in any other state is left out).
    3. Run the effect on the rows written.
    4. Record the changed ones; undo the unchanged ones and leave them to the careful path.
    """
    # Step 1: the business rows.
    by_kind: dict[str, list[ExpiryEvent]] = {}
    for event in unique.values():
        if scope.kinds[event.kind].apply_in_db is not None:
            by_kind.setdefault(event.kind, []).append(event)
    candidates = {name: ready(scope, scope.kinds[name], batch, present.get(name, {}))
                  for name, batch in by_kind.items()}
    events = [e for batch in candidates.values() for e, _ in batch]
    if not events:
        return set()
    # Step 2: ledger rows first.
    written = settle(scope.conn, events, extra, scope.now)
    # Step 3: the effect, on the rows written.
    applied: list[tuple[ExpiryEvent, int]] = []
    withdrawn: list[str] = []
    restored: list[str] = []
    for name, batch in candidates.items():
        ours = [(e, subject) for e, subject in batch if e.op_key in written]
        apply = scope.kinds[name].apply_in_db
        if not ours or apply is None:
            continue
        changed = apply(scope.conn, [subject for _, subject in ours], scope.now)
        for event, _ in ours:
            row = written[event.op_key]
            if event.subject_key in changed:
                applied.append((event, row.attempt))
            else:
                (withdrawn if row.fresh else restored).append(event.op_key)
    # Step 4: record the changed, undo the unchanged.
    record_settled(scope.conn, scope.writes, applied, withdrawn, restored)
    for event, _ in applied:
        scope.result.applied.append(event.op_key)
        if written[event.op_key].fresh:
            scope.result.duplicates += scope.writes.duplicates.pop(event.op_key, 0)
    return {event.op_key for event, _ in applied}


def ready(scope: BatchScope, kind: CleanupKind, batch: list[ExpiryEvent], present: Mapping[str, SubjectRow]
          ) -> list[tuple[ExpiryEvent, Any]]:
    """The events of `batch` (one kind), with their parsed subjects, whose business row is present
    (in `present`, as the batch read it), of the event's tenant (when the table has one), eligible
    and due at the scope's now."""
    tenants = kind.has_tenant
    out = []
    for event in batch:
        row = present.get(event.subject_key)
        if (row is not None and row.eligible and due_by(row.due_at, scope.now)
                and (not tenants or row.tenant == event.tenant)):
            try:
                out.append((event, kind.parse_key(event.subject_key)))
            except ValueError:
                continue  # invalid: the careful path dead-letters it
    return out


def due_by(due_at: Any, now: datetime) -> bool:
    """Whether a business row's due time has come. A due column this cannot compare with an instant
    (a naive timestamp, a date) counts as due: the effect's own condition then decides, and an
    unchanged row goes to the careful path."""
    try:
        return bool(due_at <= now)
    except TypeError:
        return True
