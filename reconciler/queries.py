"""SQL of the reconciler: eligible business rows with their ledger states, stuck ledger rows.

Every statement is a bounded page walked by a keyset cursor, and each one is served by an index:
the kind's due index (e.g. ix_reservations_held_due), ix_cleanup_ledger_kind_subject and
ix_cleanup_ledger_state_due_key (the op key primary key for the conditional update).
tests/test_reconcile_scale.py checks that with EXPLAIN.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    Connection,
    Select,
    func,
    literal,
    null,
    or_,
    select,
    tuple_,
    union_all,
    update,
)

from lapse.kernel.kinds import CleanupKind, EligibleRow
from lapse.kernel.ledger import APPLIED, CLAIMED, PENDING, RETRY_SCHEDULED, SKIPPED
from lapse.kernel.models import cleanup_ledger as L

# The ledger states the reconciler re-emits when stuck, with the reason it reports for each.
STUCK_REASONS = {PENDING: "stuck_pending", CLAIMED: "stuck_claimed", RETRY_SCHEDULED: "stuck_retry"}


# Ledger states of an eligible business row that the reconciler acts on: none (a gap), or a
# terminal state while the business row still looks eligible (an anomaly).
NEEDS_ATTENTION = (APPLIED, SKIPPED)


def eligible_statement(kind: CleanupKind, cutoff: datetime, after: tuple | None, limit: int) -> Select:
    """One page of business rows of `kind` due at or before `cutoff`, in (due, id) order after
    `after`. Only the rows that need attention come back (no ledger row, or a terminal one), with
    their ledger state; the last row of the page always comes back too, flagged `last`, with the
    page's row count, so the scan moves on without reading every row into Python."""
    page = kind.eligible_page(cutoff, after, limit, without_ledger=False).cte("page")
    cols = [page.c[kind.id_column.name], page.c[kind.tenant_column.name],
            page.c[kind.due_column.name]]
    # A correlated lookup, not a join: one probe of ix_cleanup_ledger_kind_subject per page row,
    # whatever the planner believes about the page's size.
    state = (select(L.c.state)
             .where(L.c.kind == kind.name,
                    L.c.subject_id == page.c[kind.id_column.name].cast(L.c.subject_id.type))
             .scalar_subquery())
    probed = select(*cols, state.label("state")).subquery("probed")
    attention = (
        select(*probed.c[:3], probed.c.state, literal(False).label("last"), literal(0).label("n"))
        .where(or_(probed.c.state.is_(None), probed.c.state.in_(NEEDS_ATTENTION)))
    )
    last = (
        select(*cols, null().label("state"), literal(True).label("last"),
               select(func.count()).select_from(page).scalar_subquery().label("n"))
        .order_by(page.c[kind.due_column.name].desc(), page.c[kind.id_column.name].desc())
        .limit(1)
    )
    return union_all(attention, last.subquery().select())


@dataclass
class EligiblePage:
    """What one page of an eligible scan found."""

    rows_scanned: int
    cursor: tuple | None
    attention: list[tuple[EligibleRow, str | None]]


def eligible_page(conn: Connection, kind: CleanupKind, cutoff: datetime, after: tuple | None,
                  limit: int) -> EligiblePage:
    """One page: rows scanned, the cursor after it, and the (row, ledger state) needing attention."""
    found, cursor, scanned = [], None, 0
    for subject, tenant, due, state, is_last, n in conn.execute(eligible_statement(kind, cutoff, after, limit)):
        if is_last:
            scanned, cursor = n, (due, subject)
        else:
            found.append((kind.to_eligible((subject, tenant, due)), state))
    return EligiblePage(scanned, cursor, found)


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
