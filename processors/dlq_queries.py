"""Dead letters for operators: list them, and replay an explicit, bounded selection.

A replay is one transaction: it picks at most `limit` dead-lettered rows matching the selection,
moves each dead_letter → pending under a new replay id (keeping the op key, so the effect still
happens at most once), resets the attempt count to 0 so the kind's full retry budget applies
again (the earlier attempts stay in ledger_transitions and travel in any later DLQ record's
history), records who, why and when as a transition, and puts the event back on lapse.expiry
through the outbox with source=replay. Rows that already went through a replay are left out
unless `include_replayed` is given, so a replayed failure returns to the dead letters and stays
there: nothing ever loops, and repeating a replay selects nothing new.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, bindparam, select, update

from lapse.kernel.ledger import DEAD_LETTER, PENDING, ExpiryEvent
from lapse.kernel.ledger_queries import insert_outbox, millis, outbox_row, record_transitions, transition
from lapse.kernel.models import cleanup_ledger as L


@dataclass(frozen=True)
class Selection:
    """Which dead letters: by kind, tenant and/or explicit op keys (all optional, combined with AND)."""

    kind: str | None = None
    tenant: str | None = None
    op_keys: tuple[str, ...] = ()
    include_replayed: bool = False

    def where(self):
        conds = [L.c.state == DEAD_LETTER]
        if self.kind:
            conds.append(L.c.kind == self.kind)
        if self.tenant:
            conds.append(L.c.tenant == self.tenant)
        if self.op_keys:
            conds.append(L.c.op_key.in_(self.op_keys))
        if not self.include_replayed:
            conds.append(L.c.replay_id.is_(None))
        return conds


LIST_COLUMNS = (L.c.op_key, L.c.kind, L.c.tenant, L.c.subject_id, L.c.attempt,
                L.c.last_failure_class, L.c.last_failure, L.c.replay_id, L.c.finished_at)


def list_dead_letters(conn: Connection, selection: Selection, limit: int) -> list[dict]:
    """Dead letters matching `selection` (replayed ones included), oldest first."""
    sel = Selection(selection.kind, selection.tenant, selection.op_keys, include_replayed=True)
    stmt = select(*LIST_COLUMNS).where(*sel.where()).order_by(L.c.finished_at, L.c.op_key).limit(limit)
    return [dict(r) for r in conn.execute(stmt).mappings()]


def replay(conn: Connection, selection: Selection, *, limit: int, reason: str, actor: str,
           now: datetime, expiry_topic: str) -> tuple[str, list[dict]]:
    """Release up to `limit` dead letters; returns (replay id, the rows released)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    replay_id = f"replay-{uuid.uuid4().hex[:12]}"
    stmt = (select(L).where(*selection.where()).order_by(L.c.finished_at, L.c.op_key).limit(limit))
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    rows = [dict(r) for r in conn.execute(stmt).mappings()]
    if not rows:
        return replay_id, []
    conn.execute(
        update(L).where(L.c.op_key == bindparam("k"), L.c.state == DEAD_LETTER).values(
            state=PENDING, attempt=0, due_at=now, replay_id=replay_id, finished_at=None,
            claim_owner=None, claim_until=None, updated_at=now),
        [{"k": r["op_key"]} for r in rows])
    record_transitions(conn, [
        transition(r["op_key"], DEAD_LETTER, PENDING, 0, actor, now, reason=reason,
                   replay_id=replay_id, correlation_id=r["correlation_id"]) for r in rows])
    insert_outbox(conn, [outbox_row(expiry_topic, r["op_key"], "expiry_event",
                                    _event_payload(r, replay_id, now), now,
                                    headers={"replay_id": replay_id}) for r in rows])
    released = [{k: r[k] for k in ("op_key", "kind", "tenant", "subject_id", "last_failure_class")}
                for r in rows]
    return replay_id, released


def _event_payload(row: dict, replay_id: str, now: datetime) -> dict:
    event = ExpiryEvent(op_key=row["op_key"], kind=row["kind"], tenant=row["tenant"],
                        subject_id=row["subject_id"], due_at=now,
                        correlation_id=row["correlation_id"], source="replay", attempt=0,
                        replay_id=replay_id)
    payload = event.to_record(now)
    payload["due_at"] = payload["produced_at"] = millis(now)
    return payload
