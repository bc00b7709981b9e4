"""Dead letters, for operators: list them, and replay or discard an explicit, bounded selection.

A replay is one transaction: it picks at most `limit` dead-lettered rows matching the selection,
moves each dead_letter → pending under a new replay id (keeping the op key, so the effect still
happens at most once), resets the attempt count to 0 so the kind's full retry budget applies
again (the earlier attempts stay in ledger_transitions and travel in any later DLQ record's
history), records who, why and when as a transition, and puts the event back on lapse.expiry
through the outbox with source=replay, carrying the trace context its dead letter kept. Rows that
already went through a replay are left out unless `include_replayed` is given, so a replayed
failure returns to the dead letters and stays there: nothing ever loops, and repeating a replay
selects nothing new.

A discard is an operator's word that a dead letter will never be retried: one transaction moves
at most `limit` matching dead letters (replayed ones included) dead_letter → discarded, recording
who and why as each row's transition. A discarded row is final: no replay selects it, and a late
redelivery of its event is absorbed as a duplicate. It publishes nothing (no outcome: the
operation's last outcome stays its dead letter, and the transition and the operator action are
the record).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lapse.kernel.ledger import (
    DEAD_LETTER,
    DISCARDED,
    PENDING,
    LedgerWrites,
    Selection,
    dead_letters,
    discard_dead_letters,
    event_for_row,
    release_dead_letters,
    traces_of,
)

SOURCE = "replay"


def list_dead_letters(conn: Connection, selection: Selection, limit: int) -> list[dict[str, Any]]:
    """Dead letters matching `selection` (replayed ones included), oldest first, as plain dicts for
    the operator's table or JSON."""
    rows = dead_letters(conn, replace(selection, include_replayed=True), limit)
    return [asdict(row) for row in rows]


def replay(conn: Connection, selection: Selection, *, limit: int, reason: str, actor: str,
           now: datetime, expiry_topic: str) -> tuple[str, list[dict[str, Any]]]:
    """Release up to `limit` dead letters; returns (replay id, the rows released)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    replay_id = f"replay-{uuid.uuid4().hex[:12]}"
    rows = release_dead_letters(conn, selection, limit, replay_id, now)
    traces = traces_of(conn, [row.op_key for row in rows])
    writes = LedgerWrites(actor, now)
    for row in rows:
        writes.transition(row.op_key, DEAD_LETTER, PENDING, row.attempt, reason=reason,
                          replay_id=replay_id, correlation_id=row.correlation_id)
        writes.expiry(expiry_topic, event_for_row(row, source=SOURCE, traceparent=traces.get(row.op_key)),
                      {"replay_id": replay_id})
    writes.flush(conn)
    released = [{"op_key": r.op_key, "kind": r.kind, "tenant": r.tenant, "subject_id": r.subject_id,
                 "last_failure_class": r.last_failure_class} for r in rows]
    return replay_id, released


def discard(conn: Connection, selection: Selection, *, limit: int, reason: str, actor: str,
            now: datetime) -> list[dict[str, Any]]:
    """Discard up to `limit` dead letters matching `selection` (replayed ones included); returns
    the rows discarded."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    rows = discard_dead_letters(conn, replace(selection, include_replayed=True), limit, now)
    writes = LedgerWrites(actor, now)
    for row in rows:
        writes.transition(row.op_key, DEAD_LETTER, DISCARDED, row.attempt, reason=reason,
                          replay_id=row.replay_id, correlation_id=row.correlation_id)
    writes.flush(conn)
    return [{"op_key": r.op_key, "kind": r.kind, "tenant": r.tenant, "subject_id": r.subject_id,
             "last_failure_class": r.last_failure_class} for r in rows]
