"""SQL of the reconciler's business-table scan: pages of eligible business rows with their ledger
states. (Its ledger statements, such as marking stuck rows and the per-row state probe, live in
`lapse.kernel.ledger`.)

Every page is bounded and walked by a keyset cursor, and served by indexes: the kind's due index
(e.g. ix_reservations_held_due) and, through `ledger_state_of`, ix_lapse_ledger_kind_subject.
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
    func,
    literal,
    null,
    or_,
    select,
    union_all,
)

from lapse.kernel.brakes import covered
from lapse.kernel.kinds import CleanupKind, EligibleRow
from lapse.kernel.ledger import HELD, SETTLED, SHADOWED, ledger_state_of, waits_past
from lapse.kernel.models import cleanup_ledger as L

# Ledger states of an eligible business row that the reconciler acts on: none (a gap), or a
# settled one while the business row still looks eligible (an anomaly); and, reported as
# WAITING_PAST_DUE, a `pending` row still waiting past now while its business row is due.
WAITING_PAST_DUE = "waiting_past_due"


def eligible_statement(kind: CleanupKind, cutoff: datetime, after: tuple[Any, ...] | None, limit: int,
                       now: datetime) -> CompoundSelect[Any]:
    """One page of business rows of `kind` due at or before `cutoff`, in (due, id) order after
    `after`. Only the rows that need attention come back (no ledger row, a settled one, or a
    `pending` one waiting past `now`), with their ledger state and whether it waits; the last row
    of the page always comes back too, flagged `last`, with the page's row count, so the scan moves
    on without reading every row into Python."""
    page = kind.eligible_page(cutoff, after, limit, without_ledger=False).cte("page")
    cols = [page.c[kind.id_column.name], page.c[kind.tenant_column.name],
            page.c[kind.due_column.name]]
    # A correlated lookup, not a join: one probe of ix_lapse_ledger_kind_subject per page row,
    # whatever the planner believes about the page's size.
    state = ledger_state_of(kind.name, page.c[kind.id_column.name])
    waiting = waits_past(kind.name, page.c[kind.id_column.name], now)
    probed = select(*cols, state.label("state"), waiting.label("waiting")).subquery("probed")
    attention = (
        select(*probed.c[:3], probed.c.state, probed.c.waiting, literal(False).label("last"),
               literal(0).label("n"))
        .where(or_(probed.c.state.is_(None), probed.c.state.in_(SETTLED), probed.c.waiting))
    )
    last = (
        select(*cols, null().label("state"), literal(False).label("waiting"), literal(True).label("last"),
               select(func.count()).select_from(page).scalar_subquery().label("n"))
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
    WAITING_PAST_DUE standing for the state of a `pending` row waiting past `now`."""
    found: list[tuple[EligibleRow, str | None]] = []
    cursor: tuple[Any, ...] | None = None
    scanned = 0
    statement = eligible_statement(kind, cutoff, after, limit, now)
    for subject, tenant, due, state, waiting, is_last, n in conn.execute(statement):
        if is_last:
            scanned, cursor = n, (due, subject)
        else:
            found.append((kind.to_eligible((subject, tenant, due)), WAITING_PAST_DUE if waiting else state))
    return EligiblePage(scanned, cursor, found)


def releasable(declared: Sequence[str], live: Sequence[str]) -> ColumnElement[bool]:
    """Parked ledger rows whose brake is off: no pause covers their kind and tenant, and a held
    row's kind is declared, a shadowed row's kind is live."""
    return and_(~covered(L.c.kind, L.c.tenant),
                or_(and_(L.c.state == HELD, L.c.kind.in_(declared)), and_(L.c.state == SHADOWED, L.c.kind.in_(live))))
