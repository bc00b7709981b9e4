"""A shadow-mode kind in a batch: the whole pipeline runs, the effect does not. Each due operation
is parked `shadowed` with a record of what live work would have done to its business row — apply
(the values it would set, the row it would delete, the call it would make), skip, wait or
dead-letter — and an outcome with status `shadow`. Switched to live, the kind's shadowed rows are
released (`lapse.reconciler.release`) and each is applied once: docs/design/brakes.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lapse.kernel.brakes import ShadowEffect, record_shadow_effects
from lapse.kernel.brakes.shadows import APPLY, DEAD_LETTER, LATER, SKIP
from lapse.kernel.kinds import CleanupKind, SubjectRow
from lapse.kernel.kinds.plan import jsonable, would
from lapse.kernel.ledger import SHADOWED, ExpiryEvent, insert_pending, park, read_rows
from lapse.kernel.text import one_line
from lapse.processors.fast_path import due_by
from lapse.processors.scope import BatchScope


def shadow(scope: BatchScope, events: Sequence[ExpiryEvent]) -> set[str]:
    """Park the due ones of `events` (one per op key, of shadow-mode kinds) as shadowed, each with
    its shadow record and outcome; returns their op keys (the rest are sorted out as unclaimed)."""
    if not events:
        return set()
    by_key = {e.op_key: e for e in events}
    insert_pending(scope.conn, events, scope.now)
    before = read_rows(scope.conn, by_key)
    moved = park(scope.conn, list(by_key), SHADOWED, scope.now)
    by_kind: dict[str, list[ExpiryEvent]] = {}
    for key in moved:
        by_kind.setdefault(by_key[key].kind, []).append(by_key[key])
    records = []
    for name, batch in sorted(by_kind.items()):
        verdicts = live_would(scope, scope.kinds[name], batch)
        for event in batch:
            outcome, what = verdicts[event.op_key]
            records.append(ShadowEffect(event.op_key, event.kind, event.tenant, event.subject_id, scope.now,
                                        outcome, jsonable(what)))
            scope.writes.parked(event, before[event.op_key].state, SHADOWED, moved[event.op_key].attempt,
                                f"shadow: live work would {outcome.replace('_', '-')}")
            scope.result.shadowed.append(event.op_key)
    record_shadow_effects(scope.conn, records)
    return set(moved)


def live_would(scope: BatchScope, kind: CleanupKind, batch: list[ExpiryEvent]
               ) -> dict[str, tuple[str, dict[str, Any]]]:
    """What live work would do to each event's business row now (op key → outcome and what),
    read as the careful path reads it."""
    subjects: dict[str, Any] = {}
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for event in batch:
        try:
            subjects[event.subject_key] = kind.parse_key(event.subject_key)
        except ValueError as exc:
            out[event.op_key] = (DEAD_LETTER, {"dead_letter": one_line(str(exc), 200, escape=True)})
    rows = kind.full_rows(scope.conn, list(subjects.values()))
    for event in batch:
        if event.op_key in out:
            continue
        found = rows.get(event.subject_key)
        out[event.op_key] = verdict(kind, event, found, scope) if found else (SKIP, {"skip": "no business row"})
    return out


def verdict(kind: CleanupKind, event: ExpiryEvent, found: tuple[SubjectRow, dict[str, Any]], scope: BatchScope
            ) -> tuple[str, dict[str, Any]]:
    row, values = found
    if kind.has_tenant and row.tenant != event.tenant:
        return DEAD_LETTER, {"dead_letter": f"tenant mismatch: the business row's tenant is {row.tenant!r}"}
    if not row.eligible:
        return SKIP, {"skip": "the business row is no longer eligible"}
    if not due_by(row.due_at, scope.now):
        return LATER, {"later": row.due_at}
    return APPLY, would(kind, values, event.subject_id, event.tenant, scope.now)
