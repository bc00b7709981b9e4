"""Ledger reads made outside the state machine: the probes a business-table select embeds (the
sweep's "no ledger row yet, or one waiting too long", the reconciler's state per page row) and the aggregates that
`lapse status` and the daily report show. The state machine's own reads (rows by key, claims,
dead letters) are in `queries`.

A probe is an expression the caller composes into its own select, matching a ledger row by (kind,
subject id) so it is one lookup of ix_lapse_ledger_kind_subject per business row;
tests/system/test_reconcile_scale.py checks the reconciler's probe with EXPLAIN. For a kind with a
generation (`generation`: the business row's generation as text in SQL) a probe matches the row of
the business row's current lapse by its op key instead, one lookup of the primary key: the rows of
its earlier lapses are other operations (docs/design/generations.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, ScalarSelect, String, and_, exists, func, literal, or_, select, text

from lapse.kernel.ledger import states
from lapse.kernel.ledger.keys import GENERATION_MARK
from lapse.kernel.ledger.rows import ExpiredClaims, LedgerCounts, OutboxBacklog, StateKindCount, TransitionCount
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.models import outbox as O

# Probes ------------------------------------------------------------------------------------------

def _subject_is(kind_name: str, subject_column: ColumnElement[Any],
                generation: ColumnElement[str] | None = None) -> ColumnElement[bool]:
    """The ledger row of `kind_name` whose subject id is the business row's `subject_column` (cast
    to the ledger's text subject id, so the kind/subject index serves it); with `generation`, the
    row whose op key is `<kind>:<subject id>@<generation>` (the primary key serves it)."""
    subject = subject_column.cast(L.c.subject_id.type)
    if generation is not None:
        return L.c.op_key == literal(f"{kind_name}:", String) + subject + GENERATION_MARK + generation
    return and_(L.c.kind == kind_name, L.c.subject_id == subject)


def has_ledger_row(kind_name: str, subject_column: ColumnElement[Any],
                   generation: ColumnElement[str] | None = None) -> ColumnElement[bool]:
    """EXISTS a ledger row for the business row whose id is `subject_column` (of the `generation`
    given; any when none is), correlated to the caller's select."""
    return exists().where(_subject_is(kind_name, subject_column, generation))


def has_row_not_waiting_past(kind_name: str, subject_column: ColumnElement[Any], now: datetime,
                             generation: ColumnElement[str] | None = None) -> ColumnElement[bool]:
    """EXISTS a ledger row for the business row whose id is `subject_column` (and generation) that
    someone is on: any row but a `pending` one still waiting past `now` (an event's own far-off due
    time, or a subject that did not exist when its event came). The sweep negates it on due rows:
    no ledger row yet, or one waiting past its subject's due time, both need an event. Retries keep
    their backoff."""
    return exists().where(_subject_is(kind_name, subject_column, generation),
                          or_(L.c.state != states.PENDING, L.c.due_at <= now))


def waits_past(kind_name: str, subject_column: ColumnElement[Any], now: datetime,
               generation: ColumnElement[str] | None = None) -> ColumnElement[bool]:
    """EXISTS a `pending` ledger row for the business row whose id is `subject_column` (and
    generation) still waiting past `now` (the reconciler's probe for a due subject whose row waits
    too long)."""
    return exists().where(_subject_is(kind_name, subject_column, generation), L.c.state == states.PENDING,
                          L.c.due_at > now)


def ledger_state_of(kind_name: str, subject_column: ColumnElement[Any],
                    generation: ColumnElement[str] | None = None) -> ScalarSelect[Any]:
    """The ledger state of the business row whose id is `subject_column` (and generation; NULL: no
    ledger row), as a correlated scalar subquery: one index probe per row, whatever the planner
    thinks of the caller's row count (a join could turn into a scan of the ledger)."""
    return select(L.c.state).where(_subject_is(kind_name, subject_column, generation)).scalar_subquery()


# Aggregates --------------------------------------------------------------------------------------

def parked_counts(conn: Connection) -> list[tuple[str, str, str, int]]:
    """(state, kind, tenant, rows) of the parked rows (held or shadowed), along their partial index
    (ix_lapse_ledger_parked): work waiting under a brake."""
    stmt = (select(L.c.state, L.c.kind, L.c.tenant, func.count()).where(L.c.state.in_(states.PARKED))
            .group_by(L.c.state, L.c.kind, L.c.tenant).order_by(L.c.state, L.c.kind, L.c.tenant))
    return [(state, kind, tenant, int(n)) for state, kind, tenant, n in conn.execute(stmt)]


def counts_by_state_and_kind(conn: Connection) -> list[StateKindCount]:
    """How many ledger rows each (state, kind) has, counted exactly: a scan of the whole ledger, for
    small ledgers and tests (`lapse status` and the metrics read `ledger_counts`)."""
    stmt = select(L.c.state, L.c.kind, func.count()).group_by(L.c.state, L.c.kind)
    return [StateKindCount(state, kind, n) for state, kind, n in conn.execute(stmt)]


# Below this many rows (by the planner's figure) the ledger is counted exactly: a scan of it is
# cheap, and the estimate's sampling error is a larger share of small counts.
EXACT_BELOW_ROWS = 100_000


def ledger_counts(conn: Connection, exact_below: int = EXACT_BELOW_ROWS) -> LedgerCounts:
    """The ledger's rows by (state, kind), for `lapse status` and the metrics, with no scan of the
    whole ledger once it is large.

    The unfinished states (pending, claimed, retry_scheduled), dead_letter and the parked states
    (held, shadowed) are always exact, counted through their partial indexes
    (ix_lapse_ledger_unfinished_due, ix_lapse_ledger_dead_letters, ix_lapse_ledger_parked): in a
    healthy system they are a small set. The settled states (applied, skipped; discarded once the
    statistics see it), most of the ledger, are estimated on PostgreSQL when the planner puts the
    ledger at `exact_below` rows or more: the table's row count as the planner scales it
    (pg_class.reltuples per page times the pages now), less the exact counts, split between those
    states, and between kinds, by the column statistics of the last ANALYZE
    (pg_stats.most_common_vals/most_common_freqs of `state` and `kind`). Those states are named in
    `estimated`. Exact everywhere (one grouped count of the ledger) on SQLite, on a smaller ledger,
    or when the ledger has no statistics yet (never analyzed).
    tests/integration/test_status_scale.py checks the plans (no sequential scan of the ledger) and
    the estimate (within 10%) on 2,000,000 rows.
    """
    if conn.dialect.name != "postgresql":
        return LedgerCounts(tuple(counts_by_state_and_kind(conn)))
    schema = (conn.get_execution_options().get("schema_translate_map") or {}).get(L.schema, L.schema)
    total = _planner_rows(conn, schema)
    stats = _common_values(conn, schema) if total is not None and total >= exact_below else None
    if total is None or stats is None:
        return LedgerCounts(tuple(counts_by_state_and_kind(conn)))
    exact = [StateKindCount(state, kind, n) for state, kind, n in conn.execute(
        select(L.c.state, L.c.kind, func.count()).where(L.c.state.in_(states.UNFINISHED))
        .group_by(L.c.state, L.c.kind))]
    exact += [StateKindCount(states.DEAD_LETTER, kind, n) for kind, n in conn.execute(
        select(L.c.kind, func.count()).where(L.c.state == states.DEAD_LETTER).group_by(L.c.kind))]
    parked: dict[tuple[str, str], int] = {}
    for state, kind, _, n in parked_counts(conn):
        parked[(state, kind)] = parked.get((state, kind), 0) + n
    exact += [StateKindCount(state, kind, n) for (state, kind), n in sorted(parked.items())]
    state_freq, kind_freq = stats.get("state", {}), stats.get("kind", {})
    finished = max(0.0, total - sum(c.rows for c in exact))
    # Each kind's finished rows: its share of the table less its exact rows, scaled to `finished`.
    exact_by_kind: dict[str, int] = {}
    for c in exact:
        exact_by_kind[c.kind] = exact_by_kind.get(c.kind, 0) + c.rows
    by_kind = {k: max(0.0, f * total - exact_by_kind.get(k, 0)) for k, f in kind_freq.items()}
    kind_sum = sum(by_kind.values())
    # Discarded dead letters are final too and have no index to count them by: estimated like
    # applied and skipped once the statistics see them, otherwise a share too small to tell apart.
    guessed = states.SETTLED + ((states.DISCARDED,) if states.DISCARDED in state_freq else ())
    state_sum = sum(state_freq.get(s, 0.0) for s in guessed)
    estimates = [
        StateKindCount(state, kind, n)
        for state in guessed for kind, rows in sorted(by_kind.items())
        if kind_sum and state_sum
        and (n := round(finished * rows / kind_sum * state_freq.get(state, 0.0) / state_sum)) > 0
    ]
    return LedgerCounts(tuple(exact + estimates), frozenset(guessed))


def _planner_rows(conn: Connection, schema: str | None) -> float | None:
    """The ledger's row count as the planner reckons it (reltuples per page times the pages the
    table has now); None when the ledger was never analyzed or vacuumed."""
    row = conn.execute(text(
        "SELECT c.reltuples, c.relpages, pg_relation_size(c.oid) / current_setting('block_size')::int "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = :schema AND c.relname = :table"), {"schema": schema or "public", "table": L.name}).first()
    if row is None or row[0] < 0:
        return None
    reltuples, relpages, pages = float(row[0]), int(row[1]), int(row[2])
    return reltuples / relpages * pages if relpages > 0 else reltuples


def _common_values(conn: Connection, schema: str | None) -> dict[str, dict[str, float]] | None:
    """The most common values of the ledger's `state` and `kind` with their frequencies, from the
    last ANALYZE; None when either column has none."""
    rows = conn.execute(text(
        "SELECT attname, most_common_vals::text::text[], most_common_freqs FROM pg_stats "
        "WHERE schemaname = :schema AND tablename = :table AND attname IN ('state', 'kind')"),
        {"schema": schema or "public", "table": L.name}).all()
    stats = {name: dict(zip(vals, freqs, strict=True)) for name, vals, freqs in rows if vals and freqs}
    return stats if {"state", "kind"} <= stats.keys() else None


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
