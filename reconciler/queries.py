"""SQL of the reconciler's business-table scan: pages of eligible business rows with their ledger
states. (Its ledger statements, such as marking stuck rows and the per-row state probe, live in
`lapse.kernel.ledger`.)

Every page is bounded and walked by a keyset cursor, and served by indexes: the kind's due index
(e.g. ix_reservations_held_due) and, through `ledger_state_of`, ix_lapse_ledger_kind_subject (the
ledger's primary key for a kind with a generation).
tests/system/test_reconcile_scale.py checks that with EXPLAIN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Connection,
    and_,
    case,
    false,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
)

from lapse.kernel.brakes import covered
from lapse.kernel.kinds import CleanupKind, EligibleRow
from lapse.kernel.ledger import HELD, SETTLED, SHADOWED, has_ledger_row, ledger_state_of, waits_past
from lapse.kernel.models import cleanup_ledger as L

# Ledger states of an eligible business row that the reconciler acts on: none (a gap), or a
# settled one while the business row still looks eligible (an anomaly); and, reported as
# WAITING_PAST_DUE, a `pending` row still waiting past now while its business row is due; for a
# kind with a generation, as NEW_GENERATION, none for the row's current generation while an
# earlier one has a row (a subject that lapsed again: a gap too, not an anomaly).
WAITING_PAST_DUE = "waiting_past_due"
NEW_GENERATION = "new_generation"


def eligible_statement(kind: CleanupKind, cutoff: datetime, after: tuple[Any, ...] | None, limit: int,
                       now: datetime) -> CompoundSelect[Any]:
    """One page of business rows of `kind` due at or before `cutoff`, in (due, id) order after
    `after`. Only the rows that need attention come back (no ledger row, a settled one, or a
    `pending` one waiting past `now`; for a kind with a generation, the row of its current
    generation), with their ledger state, whether it waits and whether an earlier generation has a
    row; the last row of the page always comes back too, flagged `last`, with the page's row count,
    so the scan moves on without reading every row into Python."""
    page = kind.eligible_page(cutoff, after, limit, without_ledger=False).cte("page")
    cols = [page.c[kind.id_column.name], page.c[kind.tenant_column.name], page.c[kind.due_column.name]]
    if kind.generation is not None:
        cols.append(page.c[kind.generation.name])
    generation = kind.generation_sql(page)
    # A correlated lookup, not a join: one probe of ix_lapse_ledger_kind_subject (or, with a
    # generation, of the primary key) per page row, whatever the planner believes about the page's size.
    state = ledger_state_of(kind.name, page.c[kind.id_column.name], generation)
    waiting = waits_past(kind.name, page.c[kind.id_column.name], now, generation)
    probed = select(*cols, state.label("state"), waiting.label("waiting")).subquery("probed")
    earlier = (case((probed.c.state.is_(None), has_ledger_row(kind.name, probed.c[kind.id_column.name])),
                    else_=false()) if generation is not None else false())
    attention = (
        select(*probed.c[:len(cols)], probed.c.state, probed.c.waiting, earlier.label("earlier"),
               literal(False).label("last"), literal(0).label("n"))
        .where(or_(probed.c.state.is_(None), probed.c.state.in_(SETTLED), probed.c.waiting))
    )
    last = (
        select(*cols, null().label("state"), literal(False).label("waiting"), literal(False).label("earlier"),
               literal(True).label("last"), select(func.count()).select_from(page).scalar_subquery().label("n"))
        .order_by(page.c[kind.due_column.name].desc(), page.c[kind.id_column.name].desc())
        .limit(1)
    )
    return union_all(attention, last.subquery().select())


@dataclass
class EligiblePage:
    """What one page of an eligible scan found."""

    rows_scanned: int
    cursor: tuple[Any, ...] | None
    attention: list[tuple[EligibleRow, str | None]]


def eligible_page(conn: Connection, kind: CleanupKind, cutoff: datetime, after: tuple[Any, ...] | None,
                  limit: int, now: datetime) -> EligiblePage:
    """One page: rows scanned, the cursor after it, and the (row, ledger state) needing attention,
    WAITING_PAST_DUE standing for the state of a `pending` row waiting past `now`, NEW_GENERATION
    for no row of the current generation while an earlier generation has one."""
    found: list[tuple[EligibleRow, str | None]] = []
    cursor: tuple[Any, ...] | None = None
    scanned = 0
    statement = eligible_statement(kind, cutoff, after, limit, now)
    for *business, state, waiting, earlier, is_last, n in conn.execute(statement):
        if is_last:
            scanned, cursor = n, (business[2], business[0])
        else:
            reason = WAITING_PAST_DUE if waiting else NEW_GENERATION if earlier else state
            found.append((kind.to_eligible(business), reason))
    return EligiblePage(scanned, cursor, found)


def releasable(declared: Sequence[str], live: Sequence[str]) -> ColumnElement[bool]:
    """Parked ledger rows whose brake is off: no pause covers their kind and tenant, and a held
    row's kind is declared, a shadowed row's kind is live."""
    return and_(~covered(L.c.kind, L.c.tenant),
                or_(and_(L.c.state == HELD, L.c.kind.in_(declared)), and_(L.c.state == SHADOWED, L.c.kind.in_(live))))
