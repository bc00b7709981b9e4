"""The ledger's state machine as data: every (from, to) pair of states is checked, and only the
pairs in the allowed-transitions table can be recorded (no database: the table and the writes
accumulator alone; tests/integration/test_ledger_transitions.py runs the statements)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import product

import pytest

from lapse.kernel import ledger
from lapse.kernel.ledger import (
    LedgerWrites,
    expiry_event,
)
from tests.fixtures.topology import repo_topology

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
FROM_STATES = (None, *ledger.STATES)
PAIRS = list(product(FROM_STATES, ledger.STATES))
OUTCOMES = repo_topology().outcomes
EVENT = expiry_event("release-reservation", 1, "t1", NOW - timedelta(minutes=5), source="test")

# The table, written out once more by hand: a change to the state machine must change both.
EXPECTED = {
    (None, "pending"),
    ("pending", "pending"), ("pending", "claimed"), ("pending", "applied"), ("pending", "skipped"),
    ("pending", "dead_letter"),
    ("retry_scheduled", "retry_scheduled"), ("retry_scheduled", "claimed"), ("retry_scheduled", "applied"),
    ("retry_scheduled", "skipped"), ("retry_scheduled", "dead_letter"),
    ("claimed", "claimed"), ("claimed", "pending"), ("claimed", "applied"), ("claimed", "skipped"),
    ("claimed", "retry_scheduled"), ("claimed", "dead_letter"),
    ("dead_letter", "pending"), ("dead_letter", "discarded"),
    # The brakes: parked (held, shadowed) from where a claim would start, released to pending, or
    # taken on as from pending when an event meets no brake any more.
    ("pending", "held"), ("pending", "shadowed"), ("retry_scheduled", "held"), ("retry_scheduled", "shadowed"),
    ("claimed", "held"), ("claimed", "shadowed"),
    ("held", "pending"), ("held", "claimed"), ("held", "applied"), ("held", "skipped"), ("held", "dead_letter"),
    ("held", "shadowed"),
    ("shadowed", "pending"), ("shadowed", "claimed"), ("shadowed", "applied"), ("shadowed", "skipped"),
    ("shadowed", "dead_letter"),
}


def test_the_table_names_every_state_and_only_states():
    assert set(ledger.ALLOWED) == set(FROM_STATES)
    assert all(targets <= set(ledger.STATES) for targets in ledger.ALLOWED.values())
    assert {(a, b) for a, targets in ledger.ALLOWED.items() for b in targets} == EXPECTED


def test_finished_rows_stay_finished_and_only_a_replay_reopens_a_dead_letter():
    assert ledger.ALLOWED[ledger.APPLIED] == ledger.ALLOWED[ledger.SKIPPED] == frozenset()
    assert ledger.ALLOWED[ledger.DEAD_LETTER] == {ledger.PENDING, ledger.DISCARDED}
    assert not any(ledger.PENDING in ledger.ALLOWED[s] for s in ledger.TERMINAL - {ledger.DEAD_LETTER})


def test_only_a_dead_letter_can_be_discarded_and_a_discarded_row_is_final():
    assert {a for a, targets in ledger.ALLOWED.items() if ledger.DISCARDED in targets} == {ledger.DEAD_LETTER}
    assert ledger.ALLOWED[ledger.DISCARDED] == frozenset()
    assert ledger.DISCARDED in ledger.TERMINAL and ledger.DISCARDED not in ledger.UNFINISHED


def test_every_state_is_reachable_from_a_new_row():
    seen, todo = set(), [None]
    while todo:
        for nxt in ledger.ALLOWED[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(ledger.STATES)


@pytest.mark.parametrize(("from_state", "to_state"), PAIRS)
def test_check_passes_exactly_the_allowed_pairs(from_state, to_state):
    if (from_state, to_state) in EXPECTED:
        ledger.check(from_state, to_state)
    else:
        with pytest.raises(ledger.IllegalTransition):
            ledger.check(from_state, to_state)


@pytest.mark.parametrize(("from_state", "to_state"), PAIRS)
def test_the_writes_record_exactly_the_allowed_pairs(from_state, to_state):
    """Whatever a room decides, a transition it records goes through this ledger.check."""
    writes = LedgerWrites("w1", NOW, OUTCOMES)
    if (from_state, to_state) in EXPECTED:
        writes.transition(EVENT.op_key, from_state, to_state, 0)
        assert [(t["from_state"], t["to_state"]) for t in writes.transitions] == [(from_state, to_state)]
    else:
        with pytest.raises(ledger.IllegalTransition):
            writes.transition(EVENT.op_key, from_state, to_state, 0)
        assert writes.transitions == []


@pytest.mark.parametrize("from_state", FROM_STATES)
def test_finish_fail_and_reschedule_are_checked_too(from_state):
    writes = LedgerWrites("w1", NOW, OUTCOMES)
    for state in (ledger.APPLIED, ledger.SKIPPED):
        if (from_state, state) in EXPECTED:
            writes.finish(EVENT, from_state, state, 1)
        else:
            with pytest.raises(ledger.IllegalTransition):
                writes.finish(EVENT, from_state, state, 1)
    for state in (ledger.RETRY_SCHEDULED, ledger.DEAD_LETTER):
        if (from_state, state) in EXPECTED:
            writes.fail(EVENT, from_state, state, 1, NOW, "temporary", "503")
        else:
            with pytest.raises(ledger.IllegalTransition):
                writes.fail(EVENT, from_state, state, 1, NOW, "temporary", "503")
    # Nothing half-recorded: each accepted move left a transition, an outcome, and its update.
    moved = [(t["from_state"], t["to_state"]) for t in writes.transitions]
    assert all(pair in EXPECTED for pair in moved)
    assert len(writes.outbox) == len(moved)
    assert len(writes.finished[ledger.APPLIED]) + len(writes.finished[ledger.SKIPPED]) + len(writes.moves) == len(moved)


def test_finish_is_only_for_a_finished_state():
    with pytest.raises(ValueError, match="applied or skipped"):
        LedgerWrites("w1", NOW, OUTCOMES).finish(EVENT, ledger.CLAIMED, ledger.DEAD_LETTER, 1)
