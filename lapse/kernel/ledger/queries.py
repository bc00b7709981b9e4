"""Every statement of the state machine: create, read, move and append, each one round trip for a
whole batch. (The probes and aggregates other code reads the ledger with are in `reads`.)

A move is a conditional UPDATE: the row must still be in the state it is moved from (and, for a
claim, still held by its owner), so two workers racing on one op key cannot both win. The target
states are checked against the state machine (`states.ALLOWED`). Statements work on PostgreSQL
and SQLite; `lapse.kernel.batch_sql` keeps their text independent of the batch size on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    bindparam,
    case,
    delete,
    false,
    or_,
    select,
    true,
    tuple_,
    update,
)

from lapse.kernel.batch_sql import any_of, bulk_insert, bulk_insert_together
from lapse.kernel.ledger import states
from lapse.kernel.ledger.records import ExpiryEvent, FailureEntry
from lapse.kernel.ledger.rows import ClaimedMove, DeadLetterRow, LedgerRow, Selection
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.models import outbox

ROW_COLUMNS = (L.c.op_key, L.c.state, L.c.attempt, L.c.due_at, L.c.claim_owner, L.c.claim_until,
               L.c.kind, L.c.subject_id, L.c.tenant, L.c.correlation_id, L.c.replay_id,
               L.c.last_failure_class)
DEAD_LETTER_COLUMNS = (L.c.op_key, L.c.kind, L.c.tenant, L.c.subject_id, L.c.attempt,
                       L.c.last_failure_class, L.c.last_failure, L.c.replay_id, L.c.finished_at)

# Where the two statements that end a claim may take it (each a move `states.ALLOWED` allows):
# `states.SETTLED`, or set back (held: a pause met before the leased call ran).
SET_BACK = (states.PENDING, states.RETRY_SCHEDULED, states.DEAD_LETTER, states.HELD)


# Create ------------------------------------------------------------------------------------------

def pending_row(event: ExpiryEvent, now: datetime) -> dict[str, Any]:
    """The `pending` ledger row of `event`, as `insert_pending` writes it."""
    return {
        **event.identity(),
        "state": states.PENDING,
        "attempt": event.attempt,
        "due_at": event.due_at,
        "correlation_id": event.correlation_id,
        "source": event.source,
        "replay_id": event.replay_id,
        "duplicates": 0,
        "created_at": now,
        "updated_at": now,
    }


def insert_pending(conn: Connection, events: Sequence[ExpiryEvent], now: datetime) -> list[str]:
    """Create `pending` ledger rows for events that have none; returns the op keys created."""
    rows = [pending_row(e, now) for e in events]
    created = bulk_insert(conn, L, rows, ignore_conflicts=True, returning=["op_key"])
    return [r.op_key for r in created]


def settled_row(event: ExpiryEvent, state: str, attempt: int, duplicates: int, now: datetime) -> dict[str, Any]:
    """The ledger row of `event` as it is once a claim of its `pending` row (`pending_row`) has
    finished in `state` at `attempt` in one transaction at `now`: what `insert_settled` writes."""
    if state not in states.SETTLED:
        raise ValueError(f"a settled row is applied or skipped, not {state}")
    return {**pending_row(event, now), "state": state, "attempt": attempt, "duplicates": duplicates,
            "finished_at": now}


def insert_settled(conn: Connection, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Create ledger rows already in their final state (`settled_row`) for op keys that have none;
    returns the op keys created. An op key whose row exists, or is being created by a concurrent
    transaction that then commits, is left out (ON CONFLICT DO NOTHING): its work is not ours."""
    states.check(None, states.PENDING)
    for row in rows:
        states.check(states.PENDING, row["state"])
    return {r.op_key for r in bulk_insert(conn, L, rows, ignore_conflicts=True, returning=["op_key"])}


def withdraw_settled(conn: Connection, op_keys: Sequence[str], now: datetime) -> int:
    """Delete rows `insert_settled` created in this transaction (at `now`, so no one else has seen
    them) whose effect then changed nothing: their op keys go on as if never written. Returns how
    many were deleted."""
    if not op_keys:
        return 0
    stmt = delete(L).where(any_of(conn, L.c.op_key, op_keys), L.c.created_at == now,
                           L.c.finished_at == now, L.c.state.in_(states.SETTLED))
    return conn.execute(stmt).rowcount


# Read --------------------------------------------------------------------------------------------

def read_rows(conn: Connection, op_keys: Iterable[str]) -> dict[str, LedgerRow]:
    """op_key → its ledger row, for the keys that have one."""
    stmt = select(*ROW_COLUMNS).where(any_of(conn, L.c.op_key, list(op_keys)))
    rows: Iterable[Sequence[Any]] = conn.execute(stmt)
    return {row[0]: LedgerRow(*row) for row in rows}


def in_flight(conn: Connection, op_keys: Sequence[str]) -> set[str]:
    """The keys among `op_keys` still to be done by a processor (`pending` or `claimed`): the
    sweep's events not finished yet (one primary-key probe for them all; no lock). The state is
    checked on each row found, as a CASE: as a plain condition it matches the partial index of
    unfinished rows, which the planner walked whole (every pending row against the array: up to
    1 s a call behind a 100,000-row backlog) while the ledger's statistics counted none."""
    if not op_keys:
        return set()
    unfinished = case((L.c.state.in_((states.PENDING, states.CLAIMED)), true()), else_=false())
    stmt = select(L.c.op_key).where(any_of(conn, L.c.op_key, op_keys), unfinished)
    return set(conn.execute(stmt).scalars())


def lock_claims(conn: Connection, op_keys: Sequence[str], owner: str) -> dict[str, LedgerRow]:
    """Lock the rows among `op_keys` still claimed by `owner` (FOR UPDATE on PostgreSQL)."""
    stmt = select(*ROW_COLUMNS).where(L.c.op_key.in_(op_keys), L.c.state == states.CLAIMED,
                                      L.c.claim_owner == owner)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    rows: Iterable[Sequence[Any]] = conn.execute(stmt)
    return {row[0]: LedgerRow(*row) for row in rows}


def failure_history(conn: Connection, op_keys: Sequence[str]) -> dict[str, list[FailureEntry]]:
    """Earlier failed attempts per op key, oldest first, from the transitions."""
    if not op_keys:
        return {}
    rows = conn.execute(
        select(T.c.op_key, T.c.attempt, T.c.failure_class, T.c.reason, T.c.at, T.c.replay_id)
        .where(T.c.op_key.in_(op_keys), T.c.failure_class.is_not(None))
        .order_by(T.c.id)
    )
    out: dict[str, list[FailureEntry]] = {}
    for key, attempt, cls, reason, at, replay_id in rows:
        out.setdefault(key, []).append(FailureEntry(attempt, cls, reason or "", at, replay_id))
    return out


def _dead_letter_filter(selection: Selection) -> list[ColumnElement[bool]]:
    conds = [L.c.state == states.DEAD_LETTER]
    if selection.kind:
        conds.append(L.c.kind == selection.kind)
    if selection.tenant:
        conds.append(L.c.tenant == selection.tenant)
    if selection.op_keys:
        conds.append(L.c.op_key.in_(selection.op_keys))
    if not selection.include_replayed:
        conds.append(L.c.replay_id.is_(None))
    return conds


def dead_letters(conn: Connection, selection: Selection, limit: int) -> list[DeadLetterRow]:
    """Dead letters matching `selection`, oldest first."""
    stmt = (select(*DEAD_LETTER_COLUMNS).where(*_dead_letter_filter(selection))
            .order_by(L.c.finished_at, L.c.op_key).limit(limit))
    return [DeadLetterRow(*row) for row in conn.execute(stmt)]


# Move --------------------------------------------------------------------------------------------

def claimable(now: datetime) -> ColumnElement[bool]:
    """Waiting and due, claimed under a lease that has expired, or parked: a claim is asked only
    for events the batch found no brake on, so a parked row's brake is off (its release may not
    have come yet)."""
    return or_(
        and_(L.c.state.in_(states.WAITING), L.c.due_at <= now),
        and_(L.c.state == states.CLAIMED, L.c.claim_until < now),
        L.c.state.in_(states.PARKED),
    )


def parkable(state: str, now: datetime) -> ColumnElement[bool]:
    """What a brake may park in `state`: what a claim would take but parked rows, and for a
    shadow-mode kind also its held rows (a paused kind switched to shadow mode)."""
    taken = [and_(L.c.state.in_(states.WAITING), L.c.due_at <= now),
             and_(L.c.state == states.CLAIMED, L.c.claim_until < now)]
    if state == states.SHADOWED:
        taken.append(L.c.state == states.HELD)
    return or_(*taken)


def claim(conn: Connection, op_keys: Sequence[str], owner: str, now: datetime, until: datetime
          ) -> set[str]:
    """pending | retry_scheduled | expired claimed | held | shadowed → claimed by `owner` until
    `until`, for the claimable rows among `op_keys`; returns the op keys claimed.

    Taking over an expired claim counts the lost holder's attempt (its effect may have run): the
    attempt goes up by one, so the new holder's call carries a higher attempt and a worker that dies
    on every try still runs out of attempts."""
    if not op_keys:
        return set()
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), claimable(now))
        .values(state=states.CLAIMED, claim_owner=owner, claim_until=until, updated_at=now,
                attempt=case((L.c.state == states.CLAIMED, L.c.attempt + 1), else_=L.c.attempt))
        .returning(L.c.op_key)
    )
    return set(conn.execute(stmt).scalars())


def park(conn: Connection, op_keys: Sequence[str], state: str, now: datetime) -> dict[str, LedgerRow]:
    """Claimable rows among `op_keys` → `state` (held: a brake is on; shadowed: a shadow-mode
    kind recorded what its effect would do), no effect run and no attempt charged; an expired
    claim counts its lost holder's attempt, as a takeover does. Returns them as moved."""
    if state not in states.PARKED:
        raise ValueError(f"park moves work to {' or '.join(states.PARKED)}, not {state}")
    if not op_keys:
        return {}
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), parkable(state, now))
        .values(state=state, claim_owner=None, claim_until=None, updated_at=now,
                attempt=case((L.c.state == states.CLAIMED, L.c.attempt + 1), else_=L.c.attempt))
        .returning(*ROW_COLUMNS)
    )
    return {row[0]: LedgerRow(*row) for row in conn.execute(stmt)}


def release_parked(conn: Connection, releasable: ColumnElement[bool], limit: int, now: datetime
                   ) -> list[tuple[str, LedgerRow]]:
    """held | shadowed → pending, due now, attempt unchanged: up to `limit` parked rows that
    `releasable` admits (skipping rows a concurrent release holds on PostgreSQL); returns (state
    before, row after) for each, in op key order."""
    for parked in states.PARKED:
        states.check(parked, states.PENDING)
    pick = (select(L.c.op_key, L.c.state).where(L.c.state.in_(states.PARKED), releasable)
            .order_by(L.c.op_key).limit(limit))
    if conn.dialect.name == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    before = {key: state for key, state in conn.execute(pick)}
    if not before:
        return []
    stmt = (update(L).where(L.c.op_key.in_(list(before)), L.c.state.in_(states.PARKED))
            .values(state=states.PENDING, due_at=now, updated_at=now).returning(*ROW_COLUMNS))
    moved = {row[0]: LedgerRow(*row) for row in conn.execute(stmt)}
    return [(before[key], moved[key]) for key in sorted(moved)]


def renew_leases(conn: Connection, op_keys: Sequence[str], owner: str, until: datetime) -> None:
    """claimed → claimed: extend this owner's live claims on `op_keys` to `until`."""
    conn.execute(update(L).where(L.c.op_key.in_(op_keys), L.c.state == states.CLAIMED,
                                 L.c.claim_owner == owner).values(claim_until=until))


def finish(conn: Connection, op_keys: Sequence[str], owner: str, state: str, now: datetime) -> int:
    """claimed → `state` (applied or skipped) for rows this owner claimed, one more attempt
    counted; returns how many moved.

    `claim_owner` is set only while a row is claimed (every move out of `claimed` clears it), so
    it stands for `state = 'claimed'` here; leaving `state` out keeps the planner on the primary
    key instead of a state index full of dead entries from earlier transitions."""
    if state not in states.SETTLED:
        raise ValueError(f"finish moves a claim to applied or skipped, not {state}")
    if not op_keys:
        return 0
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), L.c.claim_owner == owner)
        .values(state=state, attempt=L.c.attempt + 1, finished_at=now, updated_at=now,
                claim_owner=None, claim_until=None)
    )
    return conn.execute(stmt).rowcount


def move_claimed(conn: Connection, moves: Sequence[ClaimedMove], owner: str, now: datetime) -> int:
    """claimed → pending | retry_scheduled | dead_letter for rows this owner claimed, each with its
    attempt, due time and failure; returns how many moved."""
    if not moves:
        return 0
    for move in moves:
        if move.state not in SET_BACK:
            raise ValueError(f"move_claimed moves a claim to {', '.join(SET_BACK)}, not {move.state}")
    stmt = (
        update(L)
        .where(L.c.op_key == bindparam("k"), L.c.state == states.CLAIMED, L.c.claim_owner == owner)
        .values(
            state=bindparam("new_state"),
            attempt=bindparam("new_attempt"),
            due_at=bindparam("new_due_at"),
            last_failure_class=bindparam("failure_class"),
            last_failure=bindparam("failure"),
            finished_at=bindparam("new_finished_at"),
            claim_owner=None,
            claim_until=None,
            updated_at=now,
        )
    )
    params = [{"k": m.op_key, "new_state": m.state, "new_attempt": m.attempt, "new_due_at": m.due_at,
               "failure_class": m.failure_class, "failure": m.failure,
               "new_finished_at": m.finished_at} for m in moves]
    return conn.execute(stmt, params).rowcount


def bring_forward(conn: Connection, op_keys: Sequence[str], now: datetime) -> list[LedgerRow]:
    """pending → pending, due now: the rows among `op_keys` still `pending` and waiting past `now`
    although their business row says the work is due (or due sooner); returns them as moved.

    Only the business row says when work is due; an event's own due time (2100, or a recheck of a
    subject that did not exist yet) must not hold it back. `retry_scheduled` rows keep their
    backoff. Re-checking the state and due time in the UPDATE lets a concurrent claim win."""
    if not op_keys:
        return []
    states.check(states.PENDING, states.PENDING)
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), L.c.state == states.PENDING, L.c.due_at > now)
        .values(due_at=now, updated_at=now)
        .returning(*ROW_COLUMNS)
    )
    return [LedgerRow(*row) for row in conn.execute(stmt)]


def settle_waiting(conn: Connection, op_keys: Sequence[str], now: datetime) -> dict[str, LedgerRow]:
    """pending → applied in one move: the rows among `op_keys` still `pending`, due by `now`,
    unclaimed and unfinished are written as a claim of them finished `applied` in this transaction
    at `now` leaves them (`claim` then `finish`): one more attempt, finished and updated at `now`,
    no claim. Returns them as moved (op_key → the row after the move).

    The conditions are checked in the UPDATE, so a row another transaction claimed, finished or
    moved is left out (and one it is moving makes this wait for it, as a claim does). The portable
    form of `settling.settle`'s move."""
    if not op_keys:
        return {}
    states.check(states.PENDING, states.APPLIED)
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), L.c.state == states.PENDING, L.c.due_at <= now,
               L.c.claim_owner.is_(None), L.c.claim_until.is_(None), L.c.finished_at.is_(None))
        .values(state=states.APPLIED, attempt=L.c.attempt + 1, finished_at=now, updated_at=now)
        .returning(*ROW_COLUMNS)
    )
    return {row[0]: LedgerRow(*row) for row in conn.execute(stmt)}


def restore_waiting(conn: Connection, op_keys: Sequence[str], now: datetime) -> int:
    """Undo `settle_waiting` for the rows among `op_keys` it moved in this transaction (at `now`, so
    no one else has seen the move) whose effect then changed nothing: `pending` again, one attempt
    lower, unfinished and unclaimed, as they were (the move required those), `updated_at` left at
    `now` (the careful path claims them next, in this transaction). Not a transition of the state
    machine, an undo of one never committed. Returns how many were restored."""
    if not op_keys:
        return 0
    stmt = (
        update(L)
        .where(any_of(conn, L.c.op_key, op_keys), L.c.state == states.APPLIED, L.c.finished_at == now,
               L.c.updated_at == now)
        .values(state=states.PENDING, attempt=L.c.attempt - 1, finished_at=None)
    )
    return conn.execute(stmt).rowcount


def release_dead_letters(conn: Connection, selection: Selection, limit: int, replay_id: str,
                         now: datetime) -> list[LedgerRow]:
    """dead_letter → pending, due now, attempt 0, under `replay_id`: up to `limit` dead letters
    matching `selection`, oldest first (skipping rows another replay holds); returns them as
    released."""
    return _take_dead_letters(conn, selection, limit, state=states.PENDING, attempt=0, due_at=now,
                              replay_id=replay_id, finished_at=None, claim_owner=None, claim_until=None,
                              updated_at=now)


def discard_dead_letters(conn: Connection, selection: Selection, limit: int, now: datetime
                         ) -> list[LedgerRow]:
    """dead_letter → discarded, finished now: up to `limit` dead letters matching `selection`,
    oldest first (skipping rows a concurrent replay or discard holds); returns them as discarded.
    The row keeps its last failure and replay id; it is final (`states.TERMINAL`)."""
    states.check(states.DEAD_LETTER, states.DISCARDED)
    return _take_dead_letters(conn, selection, limit, state=states.DISCARDED, finished_at=now,
                              claim_owner=None, claim_until=None, updated_at=now)


def _take_dead_letters(conn: Connection, selection: Selection, limit: int, **values: object) -> list[LedgerRow]:
    """Set `values` on up to `limit` dead letters matching `selection`, oldest first, skipping rows
    a concurrent operator action holds (PostgreSQL); the rows after the change, in that order."""
    pick = (select(L.c.op_key).where(*_dead_letter_filter(selection))
            .order_by(L.c.finished_at, L.c.op_key).limit(limit))
    if conn.dialect.name == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    keys = list(conn.execute(pick).scalars())
    if not keys:
        return []
    stmt = (update(L).where(L.c.op_key.in_(keys), L.c.state == states.DEAD_LETTER).values(**values)
            .returning(*ROW_COLUMNS))
    changed = {row[0]: LedgerRow(*row) for row in conn.execute(stmt)}
    return [changed[k] for k in keys if k in changed]


def stuck_order(state: str) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """The keyset of a stuck scan: claims by lease end (ix_cleanup_ledger_claimed_until), the
    waiting states by due time (ix_cleanup_ledger_state_due_key); op key breaks ties."""
    return (L.c.claim_until if state == states.CLAIMED else L.c.due_at, L.c.op_key)


def stuck_statement(state: str, cutoff: datetime, after: tuple[Any, ...] | None, limit: int
                    ) -> Select[str]:
    """Ledger rows in `state` untouched since `cutoff` and due by then (a claim: whose lease ended
    by then), in keyset order after `after`."""
    order = stuck_order(state)
    conds = [L.c.state == state, order[0] <= cutoff, L.c.updated_at <= cutoff]
    if after is not None:
        conds.append(tuple_(*order) > tuple_(*after))
    return select(L.c.op_key).where(*conds).order_by(*order).limit(limit)


def mark_stuck_statement(state: str, cutoff: datetime, after: tuple[Any, ...] | None, limit: int,
                         now: datetime) -> Any:
    """`state` → `state`: mark one page of stuck rows as re-emitted (updated_at = now) in one
    statement, re-checking the state so a processor that claimed a row meanwhile wins."""
    states.check(state, state)
    page = stuck_statement(state, cutoff, after, limit).scalar_subquery()
    return (
        update(L)
        .where(L.c.op_key.in_(page), L.c.state == state, L.c.updated_at <= cutoff)
        .values(updated_at=now)
        .returning(*ROW_COLUMNS)
    )


def mark_stuck(conn: Connection, state: str, cutoff: datetime, after: tuple[Any, ...] | None,
               limit: int, now: datetime) -> list[LedgerRow]:
    """The rows marked, in keyset order; `stuck_cursor` of the last one continues the scan."""
    rows = [LedgerRow(*row) for row in conn.execute(mark_stuck_statement(state, cutoff, after, limit, now))]
    return sorted(rows, key=lambda r: stuck_cursor(state, r))


def stuck_cursor(state: str, row: LedgerRow) -> tuple[Any, str]:
    return (row.claim_until if state == states.CLAIMED else row.due_at, row.op_key)


def add_duplicates(conn: Connection, counts: Mapping[str, int]) -> None:
    """Count deliveries absorbed because the op key was already handled (or repeated in a batch)."""
    if not counts:
        return
    stmt = update(L).where(L.c.op_key == bindparam("k")).values(duplicates=L.c.duplicates + bindparam("n"))
    conn.execute(stmt, [{"k": k, "n": n} for k, n in counts.items()])


def keep_traces(conn: Connection, traces: Mapping[str, str]) -> None:
    """Keep each dead-lettered operation's traceparent (op key → traceparent) on its ledger row."""
    if not traces:
        return
    stmt = update(L).where(L.c.op_key == bindparam("k")).values(traceparent=bindparam("t"))
    conn.execute(stmt, [{"k": k, "t": t} for k, t in traces.items()])


def traces_of(conn: Connection, op_keys: Sequence[str]) -> dict[str, str]:
    """op key → the traceparent kept on its ledger row, for the keys that have one."""
    if not op_keys:
        return {}
    stmt = select(L.c.op_key, L.c.traceparent).where(any_of(conn, L.c.op_key, list(op_keys)),
                                                      L.c.traceparent.is_not(None))
    return {key: traceparent for key, traceparent in conn.execute(stmt)}


# Append ------------------------------------------------------------------------------------------

def insert_transitions_and_outbox(conn: Connection, transitions: Sequence[dict[str, Any]],
                                  outbox_rows: Sequence[dict[str, Any]]) -> None:
    """Append transitions and outbox rows in one statement (one round trip) on PostgreSQL."""
    bulk_insert_together(conn, [(T, transitions), (outbox, outbox_rows)])

