"""The statements of retention: remove finished ledger rows, the transitions of removed rows and
sent outbox rows once they are older than their horizon, one bounded batch per statement, and count
what a pass would remove (`lapse prune --dry-run`). The horizons themselves are decided in
`lapse.retention.horizons`; here they arrive as cutoff times.

Every statement walks an index, never a table (tests/system/test_prune_plans.py checks the plans
on a 2,000,000-row ledger):

- applied and skipped rows: ix_lapse_ledger_settled_finished (state, finished_at, partial to those
  states);
- dead letters: ix_lapse_ledger_dead_letters (finished_at, op_key, partial to dead_letter);
- discarded dead letters (the same horizon as dead letters): no ledger index covers them (the
  partial indexes above would need their predicates changed, a migration, for a handful of rows),
  so they are found through their discard transition, which stays while the row does: a walk of
  ix_lapse_transitions_at before the cutoff, the range the transitions' prune walks anyway, each
  candidate's ledger row probed by primary key;
- transitions: ix_lapse_transitions_at, each candidate's ledger row probed by primary key;
- sent outbox rows: ix_lapse_outbox_sent (sent_at, partial to sent rows).

On PostgreSQL, where transitions and the outbox are time-partitioned (migration 0009,
`lapse.kernel.ledger.partitions`), old partitions are dropped whole instead; the batched deletes
here then run on their DEFAULT partitions only (`table=` the DEFAULT partition): transitions older
than the history horizon (`prune_history_statement`, its `at` index) and sent outbox rows older
than the outbox horizon (its sent index).

The state terms are literals, not parameters: SQLite's planner uses a partial index only when the
query repeats the index's WHERE term, and PostgreSQL cannot match a partial index against a
parameter in a generic (prepared) plan. A batch picks its rows oldest first, in index order, in a
subquery, and the DELETE re-checks the conditions, so a dead letter replayed meanwhile (back to
`pending`) stays. Discarded dead letters count with the dead letters (`ledger_dead_letters`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Delete, Select, Table, and_, delete, func, literal_column, select
from sqlalchemy.sql.dml import ReturningDelete

from lapse.kernel.ledger import states
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.models import outbox as O
from lapse.kernel.models import shadow_effects as S


# What the partial indexes' predicates say, spelled as they do (see the module's docstring).
def _literal_states(names: tuple[str, ...]) -> list[ColumnElement[Any]]:
    return [literal_column(f"'{name}'") for name in names]


def settled() -> ColumnElement[bool]:
    """`state IN ('applied', 'skipped')`: the predicate of ix_lapse_ledger_settled_finished."""
    return L.c.state.in_(_literal_states(states.SETTLED))


def dead_lettered() -> ColumnElement[bool]:
    """`state = 'dead_letter'`: the predicate of ix_lapse_ledger_dead_letters."""
    return L.c.state == literal_column(f"'{states.DEAD_LETTER}'")


def discarded() -> ColumnElement[bool]:
    """`state = 'discarded'`, a literal like the other state terms."""
    return L.c.state == literal_column(f"'{states.DISCARDED}'")


def _finished_before(state_term: ColumnElement[bool], cutoff: datetime) -> list[ColumnElement[bool]]:
    return [state_term, L.c.finished_at < cutoff]


def _in_batch(dialect: str, key: ColumnElement[Any], batch: Select[Any]) -> ColumnElement[bool]:
    """`key` among the keys `batch` picks. On PostgreSQL `key = ANY(ARRAY(batch))`: the batch is
    computed once and its rows are then fetched by primary key, whatever the planner makes of its
    size (an `IN (batch)` semi-join may hash the batch and scan the whole table for it). SQLite
    probes `IN (batch)` by key."""
    if dialect == "postgresql":
        return key == func.any(func.array(batch.scalar_subquery()))
    return key.in_(batch.scalar_subquery())


# Ledger ------------------------------------------------------------------------------------------

def prune_settled_statement(dialect: str, state: str, cutoff: datetime, limit: int) -> Delete:
    """Delete up to `limit` rows in `state` (applied or skipped) finished before `cutoff`, oldest
    first. One state at a time, so the batch is a range of ix_lapse_ledger_settled_finished in
    order: PostgreSQL's planner, seeing how many rows of both states qualify on a grown ledger,
    would otherwise read the table until it has a batch, and read all of it for the last one. The
    `IN` term is the index's predicate repeated, for SQLite."""
    if state not in states.SETTLED:
        raise ValueError(f"settled rows are applied or skipped, not {state}")
    conds = [*_finished_before(settled(), cutoff), L.c.state == literal_column(f"'{state}'")]
    batch = select(L.c.op_key).where(*conds).order_by(L.c.finished_at).limit(limit)
    return delete(L).where(_in_batch(dialect, L.c.op_key, batch), *conds)


def prune_dead_letters_statement(dialect: str, cutoff: datetime, limit: int) -> Delete:
    """Delete up to `limit` dead letters finished before `cutoff`, oldest first; one replayed
    meanwhile is no longer a dead letter and stays."""
    conds = _finished_before(dead_lettered(), cutoff)
    batch = select(L.c.op_key).where(*conds).order_by(L.c.finished_at).limit(limit)
    return delete(L).where(_in_batch(dialect, L.c.op_key, batch), *conds)


def _discarded_before(cutoff: datetime) -> list[ColumnElement[bool]]:
    """Discard transitions recorded before `cutoff` whose ledger row is still discarded and finished
    before `cutoff` (a correlated probe by primary key per transition walked, as in
    `_ledger_key_of_transition`): the discarded rows a pass removes, one transition each."""
    still = (select(L.c.op_key).where(L.c.op_key == T.c.op_key, *_finished_before(discarded(), cutoff))
             .scalar_subquery())
    return [T.c.at < cutoff, T.c.to_state == literal_column(f"'{states.DISCARDED}'"), still.is_not(None)]


def prune_discarded_statement(dialect: str, cutoff: datetime, limit: int) -> Delete:
    """Delete up to `limit` discarded rows finished before `cutoff`, oldest discard first, found by
    their discard transitions (see the module's docstring)."""
    batch = select(T.c.op_key).where(*_discarded_before(cutoff)).order_by(T.c.at).limit(limit)
    return delete(L).where(_in_batch(dialect, L.c.op_key, batch), *_finished_before(discarded(), cutoff))


def prune_settled(conn: Connection, cutoff: datetime, limit: int) -> int:
    """One batch of at most `limit` applied, then skipped rows (`prune_settled_statement`); returns
    the rows removed (fewer than `limit`: none of either state is left past the cutoff)."""
    removed = 0
    for state in states.SETTLED:
        if removed < limit:
            removed += conn.execute(prune_settled_statement(conn.dialect.name, state, cutoff, limit - removed)).rowcount
    return removed


def prune_dead_letters(conn: Connection, cutoff: datetime, limit: int) -> int:
    """One batch of at most `limit` dead letters (`prune_dead_letters_statement`), then discarded
    ones (`prune_discarded_statement`): one horizon for both. Returns the rows removed (fewer than
    `limit`: none of either is left past the cutoff)."""
    removed = conn.execute(prune_dead_letters_statement(conn.dialect.name, cutoff, limit)).rowcount
    if removed < limit:
        removed += conn.execute(prune_discarded_statement(conn.dialect.name, cutoff, limit - removed)).rowcount
    return removed


# Transitions -------------------------------------------------------------------------------------

def _ledger_key_of_transition() -> ColumnElement[Any]:
    """The op key of the transition's ledger row (NULL: none), as a correlated scalar subquery: one
    primary-key probe per transition walked. NOT EXISTS would become an anti-join, which on a
    large ledger PostgreSQL plans as a scan of the ledger and a hash of it."""
    return select(L.c.op_key).where(L.c.op_key == T.c.op_key).scalar_subquery()


def _orphaned(cutoff: datetime) -> list[ColumnElement[bool]]:
    """Transitions recorded before `cutoff` whose op key has no ledger row any more."""
    return [T.c.at < cutoff, _ledger_key_of_transition().is_(None)]


def prune_transitions_statement(dialect: str, cutoff: datetime, after: datetime | None, limit: int
                                ) -> ReturningDelete[Any]:
    """Delete up to `limit` transitions recorded before `cutoff` (and at or after `after`, the last
    batch's newest, so old transitions of rows still kept are walked past once per pass) whose
    ledger row is gone; returns the `at` of each removed."""
    conds = _orphaned(cutoff)
    if after is not None:
        conds.append(T.c.at >= after)
    batch = select(T.c.id).where(*conds).order_by(T.c.at).limit(limit)
    return delete(T).where(_in_batch(dialect, T.c.id, batch)).returning(T.c.at)


def prune_transitions(conn: Connection, cutoff: datetime, after: datetime | None, limit: int
                      ) -> tuple[int, datetime | None]:
    """One batch of `prune_transitions_statement`: the rows removed and the newest `at` among them
    (the next batch's `after`)."""
    statement = prune_transitions_statement(conn.dialect.name, cutoff, after, limit)
    removed: list[datetime] = list(conn.execute(statement).scalars())
    return len(removed), max(removed, default=after)


def prune_history_statement(dialect: str, table: Table, cutoff: datetime, limit: int) -> Delete:
    """Delete up to `limit` transitions recorded before `cutoff` from `table` (a DEFAULT partition
    of the partitioned transitions), oldest first along its `at` index, whatever their ledger row:
    the rule the partitions are dropped by."""
    batch = select(table.c.id).where(table.c.at < cutoff).order_by(table.c.at).limit(limit)
    return delete(table).where(_in_batch(dialect, table.c.id, batch))


def prune_history(conn: Connection, table: Table, cutoff: datetime, limit: int) -> int:
    """One batch of `prune_history_statement`; returns the rows removed."""
    return conn.execute(prune_history_statement(conn.dialect.name, table, cutoff, limit)).rowcount


# Outbox ------------------------------------------------------------------------------------------

def _sent_before(cutoff: datetime, table: Table = O) -> list[ColumnElement[bool]]:
    return [table.c.sent_at.is_not(None), table.c.sent_at < cutoff]


def prune_outbox_statement(dialect: str, cutoff: datetime, limit: int, table: Table = O) -> Delete:
    """Delete up to `limit` outbox rows sent before `cutoff`, oldest first; the topics keep what
    they published. Unsent rows are never touched. `table`: the outbox, or its DEFAULT partition."""
    conds = _sent_before(cutoff, table)
    batch = select(table.c.id).where(*conds).order_by(table.c.sent_at).limit(limit)
    return delete(table).where(_in_batch(dialect, table.c.id, batch))


def prune_outbox(conn: Connection, cutoff: datetime, limit: int, table: Table = O) -> int:
    """One batch of `prune_outbox_statement`; returns the rows removed."""
    return conn.execute(prune_outbox_statement(conn.dialect.name, cutoff, limit, table)).rowcount


# Counts (the dry run) ----------------------------------------------------------------------------

def count_settled_statement(cutoff: datetime) -> Select[int]:
    return select(func.count()).select_from(L).where(*_finished_before(settled(), cutoff))


def count_dead_letters_statement(cutoff: datetime) -> Select[int]:
    return select(func.count()).select_from(L).where(*_finished_before(dead_lettered(), cutoff))


def count_discarded_statement(cutoff: datetime) -> Select[int]:
    return select(func.count()).select_from(T).where(*_discarded_before(cutoff))


def count_transitions_statement(cutoff: datetime, settled_cutoff: datetime | None,
                                dead_letter_cutoff: datetime | None) -> Select[int]:
    """Transitions a pass would remove: recorded before `cutoff`, of an op key with no ledger row
    or one the same pass removes (finished before its horizon's cutoff; None: never)."""
    removed = [(settled(), settled_cutoff), (dead_lettered(), dead_letter_cutoff),
               (discarded(), dead_letter_cutoff)]
    kept = (select(L.c.op_key)
            .where(L.c.op_key == T.c.op_key,
                   *(~and_(term, L.c.finished_at < at) for term, at in removed if at is not None))
            .scalar_subquery())  # a probe per transition, as in `_ledger_key_of_transition`
    return select(func.count()).select_from(T).where(T.c.at < cutoff, kept.is_(None))


def count_outbox_statement(cutoff: datetime, table: Table = O) -> Select[int]:
    return select(func.count()).select_from(table).where(*_sent_before(cutoff, table))


def count_history_statement(table: Table, cutoff: datetime) -> Select[int]:
    """Transitions `prune_history_statement` would remove from `table` (a DEFAULT partition)."""
    return select(func.count()).select_from(table).where(table.c.at < cutoff)


def prune_shadow_effects(conn: Connection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` shadow records written before `cutoff` (the history horizon); how many
    went. Old records are few and scattered, so a page by primary key is enough."""
    page = select(S.c.op_key).where(S.c.at < cutoff).limit(limit).scalar_subquery()
    return int(conn.execute(delete(S).where(S.c.op_key.in_(page))).rowcount)


def count_shadow_effects_statement(cutoff: datetime) -> Select[Any]:
    return select(func.count()).select_from(S).where(S.c.at < cutoff)


def count_prunable(conn: Connection, *, settled_cutoff: datetime | None, dead_letter_cutoff: datetime | None,
                   transitions_cutoff: datetime | None, outbox_cutoff: datetime | None,
                   shadow_cutoff: datetime | None = None) -> dict[str, int]:
    """What a pass with these cutoffs would remove, per table (None: that horizon is forever, or,
    for transitions and the outbox on partitioned PostgreSQL, counted by the caller)."""
    return {
        "ledger_settled": 0 if settled_cutoff is None else
        conn.execute(count_settled_statement(settled_cutoff)).scalar_one(),
        "ledger_dead_letters": 0 if dead_letter_cutoff is None else
        conn.execute(count_dead_letters_statement(dead_letter_cutoff)).scalar_one()
        + conn.execute(count_discarded_statement(dead_letter_cutoff)).scalar_one(),
        "transitions": 0 if transitions_cutoff is None else
        conn.execute(count_transitions_statement(transitions_cutoff, settled_cutoff,
                                                 dead_letter_cutoff)).scalar_one(),
        "outbox": 0 if outbox_cutoff is None else conn.execute(count_outbox_statement(outbox_cutoff)).scalar_one(),
        "shadow_effects": 0 if shadow_cutoff is None else
        conn.execute(count_shadow_effects_statement(shadow_cutoff)).scalar_one(),
    }
