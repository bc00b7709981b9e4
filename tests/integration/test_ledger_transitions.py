"""The ledger's conditional UPDATEs on PostgreSQL and SQLite: each statement moves a row only from
the states it is meant for, only to its target, and only along the allowed-transitions table.

A row is seeded in every state (a claim twice: lease expired, lease live); each statement runs
over all of them in a transaction that is rolled back afterwards, and every row's state, owner,
lease and update time are compared before and after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, select

from lapse.kernel import ledger
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import (
    ClaimedMove,
    Selection,
    claim,
    expiry_event,
    insert_pending,
    mark_stuck,
    park,
    pending_row,
    release_dead_letters,
    release_parked,
    renew_leases,
)
from lapse.kernel.ledger.queries import add_duplicates, finish, move_claimed
from lapse.kernel.models import cleanup_ledger as L

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(hours=1)
OWNER = "w1"
CUTOFF = NOW - timedelta(minutes=1)

# Starting rows: a label, its state, and (for a claim) when its lease ends.
LIVE_CLAIM = "claimed, lease live"
STARTS = {
    ledger.PENDING: (ledger.PENDING, None),
    ledger.RETRY_SCHEDULED: (ledger.RETRY_SCHEDULED, None),
    ledger.CLAIMED: (ledger.CLAIMED, NOW - timedelta(minutes=10)),
    LIVE_CLAIM: (ledger.CLAIMED, NOW + timedelta(minutes=5)),
    ledger.APPLIED: (ledger.APPLIED, None),
    ledger.SKIPPED: (ledger.SKIPPED, None),
    ledger.DEAD_LETTER: (ledger.DEAD_LETTER, None),
    ledger.HELD: (ledger.HELD, None),
    ledger.SHADOWED: (ledger.SHADOWED, None),
}
KEYS = {label: f"release-reservation:{i}" for i, label in enumerate(STARTS, start=1)}


@dataclass(frozen=True)
class Statement:
    name: str
    run: Callable[[Connection, list[str]], object]
    moves: dict[str, str]  # start label → the state it is meant to leave the row in


def _move(state: str) -> Statement:
    return Statement(f"move_claimed → {state}", lambda conn, keys: move_claimed(
        conn, [ClaimedMove(k, state, 1, NOW, None, None, None) for k in keys], OWNER, NOW),
        {ledger.CLAIMED: state, LIVE_CLAIM: state})


def _stuck(state: str) -> Statement:
    moves = {label: state for label, (s, until) in STARTS.items()
             if s == state and (until is None or until <= CUTOFF)}
    return Statement(f"mark_stuck {state}", lambda conn, keys: mark_stuck(
        conn, state, CUTOFF, None, 100, NOW), moves)


def _park(state: str) -> Statement:
    moves = {ledger.PENDING: state, ledger.RETRY_SCHEDULED: state, ledger.CLAIMED: state}
    if state == ledger.SHADOWED:
        moves[ledger.HELD] = state  # a paused kind switched to shadow mode
    return Statement(f"park → {state}", lambda conn, keys: park(conn, keys, state, NOW), moves)


STATEMENTS = [
    Statement("claim (another worker)", lambda conn, keys: claim(conn, keys, "w2", NOW, NOW + timedelta(seconds=30)),
              {ledger.PENDING: ledger.CLAIMED, ledger.RETRY_SCHEDULED: ledger.CLAIMED, ledger.CLAIMED: ledger.CLAIMED,
               ledger.HELD: ledger.CLAIMED, ledger.SHADOWED: ledger.CLAIMED}),
    Statement("renew_leases", lambda conn, keys: renew_leases(conn, keys, OWNER, NOW + timedelta(minutes=9)),
              {ledger.CLAIMED: ledger.CLAIMED, LIVE_CLAIM: ledger.CLAIMED}),
    Statement("finish → applied", lambda conn, keys: finish(conn, keys, OWNER, ledger.APPLIED, NOW),
              {ledger.CLAIMED: ledger.APPLIED, LIVE_CLAIM: ledger.APPLIED}),
    Statement("finish → skipped", lambda conn, keys: finish(conn, keys, OWNER, ledger.SKIPPED, NOW),
              {ledger.CLAIMED: ledger.SKIPPED, LIVE_CLAIM: ledger.SKIPPED}),
    _move(ledger.PENDING),
    _move(ledger.RETRY_SCHEDULED),
    _move(ledger.DEAD_LETTER),
    _move(ledger.HELD),
    _park(ledger.HELD),
    _park(ledger.SHADOWED),
    Statement("release_parked", lambda conn, keys: release_parked(conn, L.c.op_key.in_(keys), 100, NOW),
              {ledger.HELD: ledger.PENDING, ledger.SHADOWED: ledger.PENDING}),
    Statement("release_dead_letters", lambda conn, keys: release_dead_letters(
        conn, Selection(op_keys=tuple(keys)), 100, "replay-1", NOW), {ledger.DEAD_LETTER: ledger.PENDING}),
    _stuck(ledger.PENDING),
    _stuck(ledger.CLAIMED),
    _stuck(ledger.RETRY_SCHEDULED),
    Statement("add_duplicates", lambda conn, keys: add_duplicates(conn, dict.fromkeys(keys, 1)), {}),
]


def seed(conn: Connection) -> None:
    rows = []
    for label, (state, until) in STARTS.items():
        event = expiry_event("release-reservation", KEYS[label].split(":")[1], "t1",
                             NOW - timedelta(minutes=5), source="test")
        rows.append({**pending_row(event, EARLIER), "state": state,
                     "claim_owner": OWNER if until else None, "claim_until": until,
                     "finished_at": EARLIER if state in (ledger.APPLIED, ledger.SKIPPED, ledger.DEAD_LETTER) else None})
    conn.execute(insert(L), rows)


def snapshot(conn: Connection) -> dict[str, tuple]:
    stmt = select(L.c.op_key, L.c.state, L.c.claim_owner, L.c.claim_until, L.c.updated_at)
    return {key: tuple(rest) for key, *rest in conn.execute(stmt)}


@pytest.fixture
def engine(db_url):
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def test_every_statement_but_the_duplicate_count_moves_some_row():
    assert [s.name for s in STATEMENTS if not s.moves] == ["add_duplicates"]


@pytest.mark.parametrize("statement", STATEMENTS, ids=lambda s: s.name)
def test_a_statement_moves_rows_only_from_the_states_it_is_meant_for(engine, statement):
    with engine.connect() as conn:
        tx = conn.begin()
        try:
            seed(conn)
            before = snapshot(conn)
            statement.run(conn, list(KEYS.values()))
            after = snapshot(conn)
        finally:
            tx.rollback()
    for label, key in KEYS.items():
        start, end = before[key][0], after[key][0]
        if label in statement.moves:
            assert after[key] != before[key], f"{statement.name} left {label} alone"
            assert end == statement.moves[label], f"{statement.name}: {label} → {end}"
            assert ledger.allowed(start, end), f"{statement.name}: {start} → {end} is not in the table"
        else:
            assert after[key] == before[key], f"{statement.name} touched {label}"


def test_insert_creates_pending_rows_and_leaves_every_existing_row_alone(engine):
    fresh = expiry_event("release-reservation", 99, "t1", NOW, source="test")
    existing = [expiry_event("release-reservation", k.split(":")[1], "t1", NOW, source="test")
                for k in KEYS.values()]
    with engine.connect() as conn:
        tx = conn.begin()
        try:
            seed(conn)
            before = snapshot(conn)
            created = insert_pending(conn, [*existing, fresh], NOW)
            after = snapshot(conn)
        finally:
            tx.rollback()
    assert created == [fresh.op_key] and ledger.allowed(None, after[fresh.op_key][0])
    assert after[fresh.op_key][0] == ledger.PENDING
    assert {k: after[k] for k in before} == before


@pytest.mark.parametrize("state", ledger.STATES)
def test_statements_refuse_a_target_they_are_not_for(engine, state):
    """The statements that end a claim, and the one that marks stuck rows, check their target
    state before they send anything: a finished row is never marked stuck."""
    claimed = [KEYS[ledger.CLAIMED]]
    with engine.connect() as conn, conn.begin():
        if state not in (ledger.APPLIED, ledger.SKIPPED):
            with pytest.raises(ValueError, match="finish moves a claim"):
                finish(conn, claimed, OWNER, state, NOW)
        if state not in (ledger.PENDING, ledger.RETRY_SCHEDULED, ledger.DEAD_LETTER, ledger.HELD):
            with pytest.raises(ValueError, match="move_claimed moves a claim"):
                move_claimed(conn, [ClaimedMove(claimed[0], state, 1, NOW, None, None, None)], OWNER, NOW)
        if state not in ledger.PARKED:
            with pytest.raises(ValueError, match="park moves work"):
                park(conn, claimed, state, NOW)
        if not ledger.allowed(state, state):
            with pytest.raises(ledger.IllegalTransition):
                mark_stuck(conn, state, CUTOFF, None, 100, NOW)
