"""SQL of the reconciler's business-table scan: pages of eligible business rows with their ledger
states. (Its ledger statements, such as marking stuck rows and the per-row state probe, live in
`lapse.kernel.ledger`.)

Every page is bounded and walked by a keyset cursor, and served by indexes: the kind's due index
(e.g. ix_reservations_held_due) and, through `ledger_state_of`, ix_cleanup_ledger_kind_subject.
tests/system/test_reconcile_scale.py checks that with EXPLAIN.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CompoundSelect,
    Connection,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
)

from lapse.kernel.kinds import CleanupKind, EligibleRow
from lapse.kernel.ledger import APPLIED, SKIPPED, ledger_state_of

# Ledger states of an eligible business row that the reconciler acts on: none (a gap), or a
# terminal state while the business row still looks eligible (an anomaly).
NEEDS_ATTENTION = (APPLIED, SKIPPED)


def eligible_statement(kind: CleanupKind, cutoff: datetime, after: tuple[Any, ...] | None, limit: int
                       ) -> CompoundSelect[Any]:
    """One page of business rows of `kind` due at or before `cutoff`, in (due, id) order after
    `after`. Only the rows that need attention come back (no ledger row, or a terminal one), with
    their ledger state; the last row of the page always comes back too, flagged `last`, with the
    page's row count, so the scan moves on without reading every row into Python."""
    page = kind.eligible_page(cutoff, after, limit, without_ledger=False).cte("page")
    cols = [page.c[kind.id_column.name], page.c[kind.tenant_column.name],
            page.c[kind.due_column.name]]
    # A correlated lookup, not a join: one probe of ix_cleanup_ledger_kind_subject per page row,
    # whatever the planner believes about the page's size.
    state = ledger_state_of(kind.name, page.c[kind.id_column.name])
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
    cursor: tuple[Any, ...] | None
    attention: list[tuple[EligibleRow, str | None]]


def eligible_page(conn: Connection, kind: CleanupKind, cutoff: datetime, after: tuple[Any, ...] | None,
                  limit: int) -> EligiblePage:
    """One page: rows scanned, the cursor after it, and the (row, ledger state) needing attention."""
    found: list[tuple[EligibleRow, str | None]] = []
    cursor: tuple[Any, ...] | None = None
    scanned = 0
    for subject, tenant, due, state, is_last, n in conn.execute(eligible_statement(kind, cutoff, after, limit)):
        if is_last:
            scanned, cursor = n, (due, subject)
        else:
            found.append((kind.to_eligible((subject, tenant, due)), state))
    return EligiblePage(scanned, cursor, found)
