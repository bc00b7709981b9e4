"""Ledger reads made outside the state machine: the probes a business-table select embeds (the
sweep's "no ledger row yet, or one waiting too long", the reconciler's state per page row) and the aggregates that
`lapse status` and the daily report show. The state machine's own reads (rows by key, claims,
dead letters) are in `queries`.

A probe is an expression the caller composes into its own select, matching a ledger row by (kind,
subject id) so it is one lookup of ix_lapse_ledger_kind_subject per business row;
tests/system/test_reconcile_scale.py checks the reconciler's probe with EXPLAIN.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, ScalarSelect, and_, exists, func, or_, select

from lapse.kernel.ledger import states
from lapse.kernel.ledger.rows import ExpiredClaims, OutboxBacklog, StateKindCount, TransitionCount
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.models import outbox as O

# Probes ------------------------------------------------------------------------------------------

def _subject_is(kind_name: str, subject_column: ColumnElement[Any]) -> ColumnElement[bool]:
    """The ledger row of `kind_name` whose subject id is the business row's `subject_column` (cast
    to the ledger's text subject id, so the kind/subject index serves it)."""
    return and_(L.c.kind == kind_name, L.c.subject_id == subject_column.cast(L.c.subject_id.type))


def has_ledger_row(kind_name: str, subject_column: ColumnElement[Any]) -> ColumnElement[bool]:
    """EXISTS a ledger row for the business row whose id is `subject_column`, correlated to the
    caller's select; the sweep negates it to emit only rows with no ledger row yet."""
    return exists().where(_subject_is(kind_name, subject_column))


def has_settled_row(kind_name: str, subject_column: ColumnElement[Any], now: datetime) -> ColumnElement[bool]:
    """EXISTS a ledger row for the business row whose id is `subject_column` that someone is on: any
    row but a `pending` one still waiting past `now` (an event's own far-off due time, or a subject
    that did not exist when its event came). The sweep negates it on due rows: no ledger row yet,
    or one waiting past its subject's due time, both need an event. Retries keep their backoff."""
    return exists().where(_subject_is(kind_name, subject_column),
                          or_(L.c.state != states.PENDING, L.c.due_at <= now))


def waits_past(kind_name: str, subject_column: ColumnElement[Any], now: datetime) -> ColumnElement[bool]:
    """EXISTS a `pending` ledger row for the business row whose id is `subject_column` still
    waiting past `now` (the reconciler's probe for a due subject whose row waits too long)."""
    return exists().where(_subject_is(kind_name, subject_column), L.c.state == states.PENDING,
                          L.c.due_at > now)


def ledger_state_of(kind_name: str, subject_column: ColumnElement[Any]) -> ScalarSelect[Any]:
    """The ledger state of the business row whose id is `subject_column` (NULL: no ledger row), as
    a correlated scalar subquery: one index probe per row, whatever the planner thinks of the
    caller's row count (a join could turn into a scan of the ledger)."""
    return select(L.c.state).where(_subject_is(kind_name, subject_column)).scalar_subquery()


# Aggregates --------------------------------------------------------------------------------------

def counts_by_state_and_kind(conn: Connection) -> list[StateKindCount]:
    """How many ledger rows each (state, kind) has, for the ledger's overview."""
    stmt = select(L.c.state, L.c.kind, func.count()).group_by(L.c.state, L.c.kind)
    return [StateKindCount(state, kind, n) for state, kind, n in conn.execute(stmt)]


def oldest_unfinished_due(conn: Connection, now: datetime) -> datetime | None:
    """The earliest due time among unfinished rows already due at `now` (None: nothing overdue),
    which tells how far behind the processors are."""
    oldest: datetime | None = conn.execute(select(func.min(L.c.due_at)).where(
        L.c.state.in_(states.UNFINISHED), L.c.due_at <= now)).scalar()
    return oldest


def outbox_backlog(conn: Connection) -> OutboxBacklog:
    """The unsent outbox rows and the oldest one's write time, both through the partial index of
    unsent rows (ix_lapse_outbox_unsent): the backlog is read, the sent history never is. Ids grow
    with time, so the lowest unsent id is the oldest."""
    unsent = conn.execute(select(func.count()).select_from(O).where(O.c.sent_at.is_(None))).scalar_one()
    oldest = conn.execute(select(O.c.created_at).where(O.c.sent_at.is_(None)).order_by(O.c.id).limit(1)).scalar()
    return OutboxBacklog(unsent, oldest)


def expired_claims(conn: Connection, now: datetime) -> ExpiredClaims:
    """Claims whose lease ended before `now`: their worker is gone or stalled."""
    count, oldest = conn.execute(select(func.count(), func.min(L.c.claim_until)).where(
        L.c.state == states.CLAIMED, L.c.claim_until < now)).one()
    return ExpiredClaims(count, oldest)


def transitions_between(conn: Connection, start: datetime, end: datetime) -> list[TransitionCount]:
    """Transitions recorded in [start, end) by kind and the state they reached, with how many op
    keys made them, in (kind, state) order; read through ix_lapse_transitions_at, joined to the
    ledger by op key for the kind."""
    stmt = (
        select(L.c.kind, T.c.to_state, func.count(), func.count(T.c.op_key.distinct()))
        .select_from(T.join(L, L.c.op_key == T.c.op_key))
        .where(T.c.at >= start, T.c.at < end)
        .group_by(L.c.kind, T.c.to_state)
        .order_by(L.c.kind, T.c.to_state)
    )
    return [TransitionCount(kind, state, n, keys) for kind, state, n, keys in conn.execute(stmt)]


def op_keys_moved_between(conn: Connection, start: datetime, end: datetime) -> int:
    """How many distinct op keys had a transition recorded in [start, end)."""
    n: int = conn.execute(select(func.count(T.c.op_key.distinct()))
                          .where(T.c.at >= start, T.c.at < end)).scalar_one()
    return n
