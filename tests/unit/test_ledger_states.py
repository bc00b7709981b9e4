"""The ledger's state machine as data: every (from, to) pair of states is checked, and only the
pairs in the allowed-transitions table can be recorded (no database: the table and the writes
accumulator alone; tests/integration/test_ledger_transitions.py runs the statements)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import product

import pytest

from lapse.kernel.ledger import (
    ALLOWED,
    APPLIED,
    CLAIMED,
    DEAD_LETTER,
    PENDING,
    RETRY_SCHEDULED,
    SKIPPED,
    STATES,
    TERMINAL,
    IllegalTransition,
    LedgerWrites,
    check,
    expiry_event,
)
from tests.fixtures.topology import repo_topology

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
FROM_STATES = (None, *STATES)
PAIRS = list(product(FROM_STATES, STATES))
OUTCOMES = repo_topology().outcomes
EVENT = expiry_event("release-reservation", 1, "t1", NOW - timedelta(minutes=5), source="test")

# The table, written out once more by hand: a change to the state machine must change both.
EXPECTED = {
    (None, PENDING),
    (PENDING, PENDING), (PENDING, CLAIMED), (PENDING, APPLIED), (PENDING, SKIPPED),
    (PENDING, DEAD_LETTER),
    (RETRY_SCHEDULED, RETRY_SCHEDULED), (RETRY_SCHEDULED, CLAIMED), (RETRY_SCHEDULED, APPLIED),
    (RETRY_SCHEDULED, SKIPPED), (RETRY_SCHEDULED, DEAD_LETTER),
    (CLAIMED, CLAIMED), (CLAIMED, PENDING), (CLAIMED, APPLIED), (CLAIMED, SKIPPED),
    (CLAIMED, RETRY_SCHEDULED), (CLAIMED, DEAD_LETTER),
    (DEAD_LETTER, PENDING),
}


def test_the_table_names_every_state_and_only_states():
    assert set(ALLOWED) == set(FROM_STATES)
    assert all(targets <= set(STATES) for targets in ALLOWED.values())
    assert {(a, b) for a, targets in ALLOWED.items() for b in targets} == EXPECTED


def test_finished_rows_stay_finished_and_only_a_replay_reopens_a_dead_letter():
    assert ALLOWED[APPLIED] == ALLOWED[SKIPPED] == frozenset()
    assert ALLOWED[DEAD_LETTER] == {PENDING}
    assert not any(PENDING in ALLOWED[s] for s in TERMINAL - {DEAD_LETTER})


def test_every_state_is_reachable_from_a_new_row():
    seen, todo = set(), [None]
    while todo:
        for nxt in ALLOWED[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(STATES)


@pytest.mark.parametrize(("from_state", "to_state"), PAIRS)
def test_check_passes_exactly_the_allowed_pairs(from_state, to_state):
    if (from_state, to_state) in EXPECTED:
        check(from_state, to_state)
    else:
        with pytest.raises(IllegalTransition):
            check(from_state, to_state)


@pytest.mark.parametrize(("from_state", "to_state"), PAIRS)
def test_the_writes_record_exactly_the_allowed_pairs(from_state, to_state):
    """Whatever a room decides, a transition it records goes through this check."""
    writes = LedgerWrites("w1", NOW, OUTCOMES)
    if (from_state, to_state) in EXPECTED:
        writes.transition(EVENT.op_key, from_state, to_state, 0)
        assert [(t["from_state"], t["to_state"]) for t in writes.transitions] == [(from_state, to_state)]
    else:
        with pytest.raises(IllegalTransition):
            writes.transition(EVENT.op_key, from_state, to_state, 0)
        assert writes.transitions == []


@pytest.mark.parametrize("from_state", FROM_STATES)
def test_finish_fail_and_reschedule_are_checked_too(from_state):
    writes = LedgerWrites("w1", NOW, OUTCOMES)
    for state in (APPLIED, SKIPPED):
        if (from_state, state) in EXPECTED:
            writes.finish(EVENT, from_state, state, 1)
        else:
            with pytest.raises(IllegalTransition):
                writes.finish(EVENT, from_state, state, 1)
    for state in (RETRY_SCHEDULED, DEAD_LETTER):
        if (from_state, state) in EXPECTED:
            writes.fail(EVENT, from_state, state, 1, NOW, "temporary", "503")
        else:
            with pytest.raises(IllegalTransition):
                writes.fail(EVENT, from_state, state, 1, NOW, "temporary", "503")
    # Nothing half-recorded: each accepted move left a transition, an outcome, and its update.
    moved = [(t["from_state"], t["to_state"]) for t in writes.transitions]
    assert all(pair in EXPECTED for pair in moved)
    assert len(writes.outbox) == len(moved)
    assert len(writes.finished[APPLIED]) + len(writes.finished[SKIPPED]) + len(writes.moves) == len(moved)


def test_finish_is_only_for_a_finished_state():
    with pytest.raises(ValueError, match="applied or skipped"):
        LedgerWrites("w1", NOW, OUTCOMES).finish(EVENT, CLAIMED, DEAD_LETTER, 1)
