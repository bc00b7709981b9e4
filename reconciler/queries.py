"""SQL of the reconciler: eligible business rows with their ledger states, stuck ledger rows.

Every statement is a bounded page walked by a keyset cursor, and each one is served by an index:
the kind's due index (e.g. ix_reservations_held_due), ix_cleanup_ledger_kind_subject and
ix_cleanup_ledger_state_due_key (the op key primary key for the conditional update). tests/test_reconcile_scale.py checks that with EXPLAIN.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Select, and_, select, tuple_, update

from lapse.kinds import CleanupKind, EligibleRow
from lapse.ledger import CLAIMED, PENDING, RETRY_SCHEDULED
from lapse.models import cleanup_ledger as L

# The ledger states the reconciler re-emits when stuck, with the reason it reports for each.
STUCK_REASONS = {PENDING: "stuck_pending", CLAIMED: "stuck_claimed", RETRY_SCHEDULED: "stuck_retry"}


def eligible_statement(kind: CleanupKind, cutoff: datetime, after: tuple | None, limit: int) -> Select:
    """Business rows of `kind` due at or before `cutoff`, in (due, id) order after `after`, each
    with its ledger state (None: no ledger row) through an outer join on (kind, subject_id)."""
    ledger_row = and_(L.c.kind == kind.name,
                      L.c.subject_id == kind.id_column.cast(L.c.subject_id.type))
    return (kind.eligible_page(cutoff, after, limit, without_ledger=False)
            .add_columns(L.c.state)
            .outerjoin_from(kind.table, L, ledger_row))


def eligible_page(conn: Connection, kind: CleanupKind, cutoff: datetime, after: tuple | None,
                  limit: int) -> list[tuple[EligibleRow, str | None]]:
    """One page of (eligible row, ledger state or None)."""
    return [(kind.to_eligible(r[:3]), r[3])
            for r in conn.execute(eligible_statement(kind, cutoff, after, limit))]


def stuck_order(state: str) -> tuple:
    """The keyset of a stuck scan: claims by lease end (ix_cleanup_ledger_claimed_until), the
    waiting states by due time (ix_cleanup_ledger_state_due_key); op key breaks ties."""
    return (L.c.claim_until if state == CLAIMED else L.c.due_at, L.c.op_key)


def stuck_statement(state: str, cutoff: datetime, after: tuple | None, limit: int) -> Select:
    """Ledger rows in `state` untouched since `cutoff` and due by then (a claim: whose lease ended
    by then), in keyset order after `after`."""
    order = stuck_order(state)
    conds = [L.c.state == state, order[0] <= cutoff, L.c.updated_at <= cutoff]
    if after is not None:
        conds.append(tuple_(*order) > tuple_(*after))
    return select(L.c.op_key).where(*conds).order_by(*order).limit(limit)


def mark_stuck_statement(state: str, cutoff: datetime, after: tuple | None, limit: int, now: datetime):
    """Mark one page of stuck rows as re-emitted (updated_at = now) in one statement, re-checking
    the state so a processor that claimed a row meanwhile wins; returns what the events need."""
    page = stuck_statement(state, cutoff, after, limit).scalar_subquery()
    return (
        update(L)
        .where(L.c.op_key.in_(page), L.c.state == state, L.c.updated_at <= cutoff)
        .values(updated_at=now)
        .returning(L.c.op_key, L.c.kind, L.c.tenant, L.c.subject_id, L.c.due_at, L.c.attempt,
                   L.c.correlation_id, L.c.replay_id, L.c.claim_until)
    )


def mark_stuck_page(conn: Connection, state: str, cutoff: datetime, after: tuple | None, limit: int,
                    now: datetime) -> list:
    """The rows marked, in keyset order; `stuck_cursor` of the last one continues the scan."""
    rows = conn.execute(mark_stuck_statement(state, cutoff, after, limit, now)).all()
    return sorted(rows, key=lambda r: stuck_cursor(state, r))


def stuck_cursor(state: str, row) -> tuple:
    return (row.claim_until if state == CLAIMED else row.due_at, row.op_key)
