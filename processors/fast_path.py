"""The fast path: due in-database work whose outcome can only be `applied`, with its ledger row
written once, already settled, instead of the careful path's three writes.

What qualifies, and why the end state is the careful path's: docs/design/processing.md, "The fast path".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from lapse.kernel.batch_sql import batch_values
from lapse.kernel.kinds import CleanupKind, SubjectRow
from lapse.kernel.kinds.statements import RowsEffect, fused_effect
from lapse.kernel.ledger import ExpiryEvent, Written, record_settled, settle, settle_and_apply
from lapse.processors.scope import BatchScope


def apply_fast_path(scope: BatchScope, unique: Mapping[str, ExpiryEvent], extra: Counter[str],
                    present: Mapping[str, Mapping[str, SubjectRow]]) -> set[str]:
    """Apply and record, in the scope's transaction, the events of `unique` (one per op key) that
    qualify; returns their op keys, for the careful path to leave out. `extra` counts the batch's
    other deliveries of each op key (an inserted row carries them as its duplicates); `present`
    holds each kind's business rows as the batch read them (`rules.subjects_present`).

    1. Keep the in-database work whose business row is present, of its tenant, eligible and due.
    2. A kind whose effect can be part of one statement with its ledger writes (a declared effect
       on PostgreSQL: `fused_effect`) takes steps 3 to 5 in that statement (`settle_and_apply`).
    3. Write its ledger rows settled (`applied`), before the effect (`settle`: waiting rows moved,
       first deliveries inserted; a row in any other state is left out).
    4. Run the effect on the rows written.
    5. Record the changed ones; undo the unchanged ones and leave them to the careful path.
    """
    # Step 1: the business rows.
    by_kind: dict[str, list[ExpiryEvent]] = {}
    for event in unique.values():
        if scope.kinds[event.kind].apply_in_db is not None:
            by_kind.setdefault(event.kind, []).append(event)
    candidates = {name: ready(scope, scope.kinds[name], batch, present.get(name, {}))
                  for name, batch in by_kind.items()}
    if not any(candidates.values()):
        return set()
    written: dict[str, Written] = {}
    changed: set[str] = set()  # op keys whose effect changed their business row
    applied: list[tuple[ExpiryEvent, int]] = []  # of those, the ones step 5 records
    # Step 2: one statement for each kind that can have one.
    rest: dict[str, list[tuple[ExpiryEvent, Any]]] = {}
    for name, batch in candidates.items():
        apply = scope.kinds[name].apply_in_db
        fused = fused_effect(apply, scope.conn) if isinstance(apply, RowsEffect) and batch else None
        if fused is None:
            rest[name] = batch
            continue
        ours, keys = settle_and_apply(scope.conn, scope.writes, [e for e, _ in batch],
                                      batch_values(scope.conn, [subject for _, subject in batch]), extra,
                                      fused.sql, fused.subject_type, fused.params(scope.now))
        written.update(ours)
        changed |= keys
    # Step 3: ledger rows first.
    events = [e for batch in rest.values() for e, _ in batch]
    if events:
        written.update(settled := settle(scope.conn, events, extra, scope.now))
        # Step 4: the effect, on the rows written.
        for name, batch in rest.items():
            ours_rest = [(e, subject) for e, subject in batch if e.op_key in settled]
            apply = scope.kinds[name].apply_in_db
            if not ours_rest or apply is None:
                continue
            done = apply(scope.conn, [subject for _, subject in ours_rest], scope.now)
            for event, _ in ours_rest:
                if event.subject_key in done:
                    changed.add(event.op_key)
                    applied.append((event, settled[event.op_key].attempt))
    # Step 5: record the changed, undo the unchanged.
    unchanged = [key for key in written if key not in changed]
    record_settled(scope.conn, scope.writes, applied, [k for k in unchanged if written[k].fresh],
                   [k for k in unchanged if not written[k].fresh])
    for key in (key for key in written if key in changed):  # in the batch's order
        scope.result.applied.append(key)
        if written[key].fresh:
            scope.result.duplicates += scope.writes.duplicates.pop(key, 0)
    return changed


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
