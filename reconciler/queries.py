"""SQL of the reconciler: eligible business rows, their ledger states, stuck ledger rows.

Every statement is a bounded page walked by a keyset cursor, and each one is served by an index:
the kind's due index (e.g. ix_reservations_held_due), ix_cleanup_ledger_kind_subject and
ix_cleanup_ledger_state_due_key. tests/test_reconcile_scale.py checks that with EXPLAIN.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Select, select, tuple_, update

from lapse.kinds import CleanupKind, EligibleRow
from lapse.ledger import CLAIMED, PENDING, RETRY_SCHEDULED
from lapse.models import cleanup_ledger as L

# The ledger states the reconciler re-emits when stuck, with the reason it reports for each.
STUCK_REASONS = {PENDING: "stuck_pending", CLAIMED: "stuck_claimed", RETRY_SCHEDULED: "stuck_retry"}


def eligible_statement(kind: CleanupKind, cutoff: datetime, after: tuple | None, limit: int) -> Select:
    """Business rows of `kind` due at or before `cutoff`, ledger row or not, in (due, id) order."""
    return kind.eligible_page(cutoff, after, limit, without_ledger=False)


def eligible_page(conn: Connection, kind: CleanupKind, cutoff: datetime, after: tuple | None,
                  limit: int) -> list[EligibleRow]:
    return [kind.to_eligible(r) for r in conn.execute(eligible_statement(kind, cutoff, after, limit))]


def ledger_states_statement(kind_name: str, subject_ids: list[str]) -> Select:
    return select(L.c.subject_id, L.c.state).where(
        L.c.kind == kind_name, L.c.subject_id.in_(subject_ids))


def ledger_states(conn: Connection, kind_name: str, subject_ids: list[str]) -> dict[str, str]:
    """subject_id → ledger state, for the subjects of one page that have a ledger row."""
    if not subject_ids:
        return {}
    return dict(conn.execute(ledger_states_statement(kind_name, subject_ids)).all())


def stuck_statement(state: str, cutoff: datetime, after: tuple | None, limit: int) -> Select:
    """Ledger rows in `state`, untouched since `cutoff` and due by then (a claim: its lease ended by
    then), in (due_at, op_key) order after `after`."""
    conds = [L.c.state == state, L.c.due_at <= cutoff, L.c.updated_at <= cutoff]
    if state == CLAIMED:
        conds.append(L.c.claim_until <= cutoff)
    if after is not None:
        conds.append(tuple_(L.c.due_at, L.c.op_key) > tuple_(*after))
    return (
        select(L.c.op_key, L.c.kind, L.c.tenant, L.c.subject_id, L.c.due_at, L.c.attempt,
               L.c.correlation_id, L.c.replay_id)
        .where(*conds)
        .order_by(L.c.due_at, L.c.op_key)
        .limit(limit)
    )


def stuck_page(conn: Connection, state: str, cutoff: datetime, after: tuple | None, limit: int) -> list:
    return conn.execute(stuck_statement(state, cutoff, after, limit)).all()


def touch_if_still_stuck(conn: Connection, op_keys: list[str], state: str, cutoff: datetime,
                         now: datetime) -> set[str]:
    """Mark rows as re-emitted (updated_at = now) if they are still in `state` and untouched since
    `cutoff`; a processor that claimed one meanwhile wins. Returns the op keys marked."""
    if not op_keys:
        return set()
    stmt = (
        update(L)
        .where(L.c.op_key.in_(op_keys), L.c.state == state, L.c.updated_at <= cutoff)
        .values(updated_at=now)
        .returning(L.c.op_key)
    )
    return set(conn.execute(stmt).scalars())
