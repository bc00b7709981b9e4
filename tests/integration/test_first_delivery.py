"""The first-delivery fast path on a real database: it must leave exactly what the careful path alone
leaves (ledger rows, business rows, outbox records, transitions, the batch's classification), stay
right when a row is created or a business row changes under it, and write each ledger row once in
a fixed number of statements."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select, update

from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import ExpiryEvent, expiry_event, insert_pending
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchResult
from tests.fixtures.fast_path import (
    DELETE,
    NOW,
    RELEASE,
    TENANT,
    assert_each_applied_once,
    batch_statements,
    counted_statements,
    engine_for,
    key,
    kinds_for,
    ledger_row,
    ledger_writes,
    paid_before_the_effect,
    race_fast_and_careful,
    release_event,
    reservation,
    rolled_back_batch,
    scope,
    seed_business,
    world_strategy,
)
from tests.fixtures.kinds import demo_kinds

SUBJECTS = 6  # reservation ids 1..6 (artifact ids 1..2)

# What each subject is, before the batch: its business row, and the ledger row its op key has.
BUSINESS = ["missing", "due", "due", "later", "paid"]
LEDGER = [None, None, None, "pending", "pending_later", "applied", "skipped", "dead_letter",
          "retry_scheduled", "claimed_expired", "claimed_live"]


def seed(conn, world: dict[str, Any]) -> None:
    seed_business(conn, world)
    ledger_rows = [ledger_row(RELEASE, rid, state) for rid, state in enumerate(world["ledger"], start=1) if state]
    if ledger_rows:
        conn.execute(insert(cleanup_ledger), ledger_rows)


def run_world(engine, kinds, world: dict[str, Any], events: list[ExpiryEvent], *, fast: bool) -> dict[str, Any]:
    """Seed `world`, run the batch (with or without the fast path), snapshot, roll everything back."""
    def prepare(conn) -> list[ExpiryEvent]:
        seed(conn, world)
        return events

    return rolled_back_batch(engine, kinds, prepare, fast=fast)


events_strategy = st.lists(
    st.builds(release_event,
              st.one_of(st.integers(1, SUBJECTS), st.just("abc")),
              due_later=st.booleans(),
              attempt=st.integers(0, 1),
              tenant=st.sampled_from([TENANT, TENANT, TENANT, "t2"])),
    min_size=1, max_size=14)
worlds = world_strategy(SUBJECTS, BUSINESS, LEDGER)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=worlds, events=events_strategy)
def test_fast_path_leaves_what_the_careful_path_leaves(db_url, world, events):
    """Mixed batches — first deliveries, redeliveries of every ledger state, events not due, missing
    subjects, other tenants, malformed subjects, external-effect kinds, duplicates in the batch — end
    the same with the fast path as with the careful path alone."""
    engine = engine_for(db_url)
    kinds = kinds_for(db_url)
    if world["artifacts"]:
        events = [*events, expiry_event(DELETE, 1, TENANT, NOW - timedelta(minutes=1), source="sweep",
                                        correlation_id="c-a1"),
                  expiry_event(DELETE, 2, TENANT, NOW - timedelta(minutes=1), source="sweep", correlation_id="c-a2")]
    careful = run_world(engine, kinds, world, events, fast=False)
    fast = run_world(engine, kinds, world, events, fast=True)
    assert fast == careful


def test_first_deliveries_are_applied_with_one_transition_and_outcome_each(db_url):
    """The common case: each due first delivery ends applied at attempt 1 with one transition
    pending → applied and one outcome, as the careful path records it; in-batch duplicates are
    counted on the row."""
    engine = make_engine(db_url)
    kinds = demo_kinds(engine)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2, 3)])
    events = [release_event(1), release_event(2), release_event(2), release_event(3)]
    with engine.begin() as conn:
        result = apply_batch(scope(conn, kinds), events)
    assert sorted(result.applied) == [key(RELEASE, r) for r in (1, 2, 3)]
    assert result.duplicates == 1
    with engine.connect() as conn:
        rows = {r.op_key: r for r in conn.execute(select(cleanup_ledger))}
        steps = list(conn.execute(select(ledger_transitions.c.op_key, ledger_transitions.c.from_state,
                                         ledger_transitions.c.to_state, ledger_transitions.c.attempt)))
        outcomes = list(conn.execute(select(outbox.c.key, outbox.c.payload)))
        released = conn.execute(select(reservations.c.status).order_by(reservations.c.id)).scalars().all()
    assert {(k, r.state, r.attempt, r.duplicates, r.finished_at, r.claim_owner) for k, r in rows.items()} == {
        (key(RELEASE, 1), "applied", 1, 0, NOW, None), (key(RELEASE, 2), "applied", 1, 1, NOW, None),
        (key(RELEASE, 3), "applied", 1, 0, NOW, None)}
    assert sorted(steps) == [(key(RELEASE, r), "pending", "applied", 1) for r in (1, 2, 3)]
    assert sorted((k, p["status"], p["attempt"]) for k, p in outcomes) == [
        (key(RELEASE, r), "applied", 1) for r in (1, 2, 3)]
    assert released == ["released"] * 3


def test_a_row_created_concurrently_leaves_its_event_to_the_careful_path(pg_url):
    """Another transaction commits a ledger row for one op key after the fast path's probe: the
    fast path's insert skips it (no effect runs for it there) and the careful path claims the row
    and applies it, once."""
    engine = make_engine(pg_url)
    release = demo_kinds(engine)[RELEASE]
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2, 3)])
    raced = release_event(2)
    created: list[str] = []

    def parse_after_a_rival(subject_id: str) -> Any:
        """Parse as the kind does; on the first call (after the probe) a rival creates op key 2's row."""
        if not created:
            with engine.begin() as rival:
                created.extend(insert_pending(rival, [raced], NOW - timedelta(seconds=1)))
        return release.parse_subject(subject_id)

    kinds = {RELEASE: replace(release, parse_subject=parse_after_a_rival)}
    with engine.begin() as conn:
        result = apply_batch(scope(conn, kinds), [release_event(1), raced, release_event(3)])
    assert created == [raced.op_key]
    assert sorted(result.applied) == [key(RELEASE, r) for r in (1, 2, 3)]
    with engine.connect() as conn:
        row = conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == raced.op_key)).mappings().one()
        steps = conn.execute(select(ledger_transitions.c.from_state, ledger_transitions.c.to_state).where(
            ledger_transitions.c.op_key == raced.op_key)).all()
        outcomes = conn.execute(select(outbox.c.key)).scalars().all()
        assert conn.execute(select(reservations.c.status)).scalars().all() == ["released"] * 3
    assert (row["state"], row["attempt"], row["created_at"]) == ("applied", 1, NOW - timedelta(seconds=1))
    assert steps == [("pending", "applied")]
    assert sorted(outcomes) == [key(RELEASE, r) for r in (1, 2, 3)]


def test_a_row_being_created_concurrently_is_waited_for_and_absorbed(pg_url):
    """A rival transaction holds an uncommitted ledger row for one op key and then applies it: the
    fast path's insert waits for it, leaves that key out, and the redelivery is a duplicate."""
    engine = make_engine(pg_url)
    kinds = demo_kinds(engine)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2)])
    raced = release_event(2)
    results: dict[str, BatchResult] = {}
    with engine.connect() as rival:
        trans = rival.begin()
        insert_pending(rival, [raced], NOW)

        def worker() -> None:
            with engine.begin() as conn:
                results["fast"] = apply_batch(scope(conn, kinds), [release_event(1), raced])

        thread = threading.Thread(target=worker)
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive()  # waiting on the rival's row
        results["rival"] = apply_batch(scope(rival, kinds, worker="w2"), [raced])
        trans.commit()
        thread.join(30)
    assert results["rival"].applied == [raced.op_key]
    assert (results["fast"].applied, results["fast"].duplicates) == ([key(RELEASE, 1)], 1)
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.status)).scalars().all() == ["released"] * 2
        assert sorted(conn.execute(select(outbox.c.key)).scalars()) == [key(RELEASE, 1), raced.op_key]
        assert conn.execute(select(cleanup_ledger.c.duplicates).where(
            cleanup_ledger.c.op_key == raced.op_key)).scalar() == 1


def test_a_business_row_that_changes_before_the_effect_goes_to_the_careful_path(db_url):
    """A payment lands between the fast path's read and its effect: the effect changes nothing, the
    fast path withdraws the row it wrote, and the careful path records the operation skipped, with
    the same rows it records when the payment came first."""
    engine = make_engine(db_url)
    release = demo_kinds(engine)[RELEASE]
    kinds = paid_before_the_effect(release, 2)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2)])
    with engine.begin() as conn:
        result = apply_batch(scope(conn, kinds), [release_event(1), release_event(2)])
    assert (result.applied, result.skipped) == ([key(RELEASE, 1)], [key(RELEASE, 2)])
    with engine.connect() as conn:
        state = {r.op_key: (r.state, r.attempt, r.finished_at) for r in conn.execute(select(cleanup_ledger))}
        steps = sorted(conn.execute(select(ledger_transitions.c.op_key, ledger_transitions.c.to_state)).all())
        outcomes = sorted((k, p["status"]) for k, p in conn.execute(select(outbox.c.key, outbox.c.payload)))
    assert state == {key(RELEASE, 1): ("applied", 1, NOW), key(RELEASE, 2): ("skipped", 1, NOW)}
    assert steps == [(key(RELEASE, 1), "applied"), (key(RELEASE, 2), "skipped")]
    assert outcomes == [(key(RELEASE, 1), "applied"), (key(RELEASE, 2), "skipped")]


def test_rows_paid_before_the_one_statement_go_to_the_careful_path(pg_url):
    """PostgreSQL's one statement (ledger rows, effect, records): a payment committed after the
    batch read the business rows leaves the effect nothing to change, for a first delivery (its
    row withdrawn) and for a waiting row (put back `pending`); the careful path then records both
    skipped, once, and the rest of the batch is applied."""
    engine = make_engine(pg_url)
    release = demo_kinds(engine)[RELEASE]
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2, 3)])
        conn.execute(insert(cleanup_ledger), [ledger_row(RELEASE, 3, "pending")])
    calls: list[str] = []

    def parse_after_a_payment(subject_id: str) -> Any:
        """Parse as the kind does; once the read has parsed each event's subject, the next call (the
        fast path's own, after the read) has reservations 2 and 3 paid first."""
        calls.append(subject_id)
        if len(calls) == 4:
            with engine.begin() as rival:
                rival.execute(update(reservations).where(reservations.c.id.in_([2, 3])).values(status="paid"))
        return release.parse_subject(subject_id)

    kinds = {RELEASE: replace(release, parse_subject=parse_after_a_payment)}
    statements = batch_statements(engine, kinds, [release_event(r) for r in (1, 2, 3)], fast=True, applied=1)
    assert len(calls) > 4  # paid between the read and the one statement
    assert any("UPDATE reservations" in s and "INSERT INTO" in s for s in statements)  # the one statement ran
    with engine.connect() as conn:
        state = {r.op_key: (r.state, r.attempt) for r in conn.execute(select(cleanup_ledger))}
        steps = sorted(conn.execute(select(ledger_transitions.c.op_key, ledger_transitions.c.from_state,
                                           ledger_transitions.c.to_state)).all())
        outcomes = sorted((k, p["status"]) for k, p in conn.execute(select(outbox.c.key, outbox.c.payload)))
        status = conn.execute(select(reservations.c.status).order_by(reservations.c.id)).scalars().all()
    assert status == ["released", "paid", "paid"]
    assert state == {key(RELEASE, 1): ("applied", 1), key(RELEASE, 2): ("skipped", 1),
                     key(RELEASE, 3): ("skipped", 2)}
    assert steps == [(key(RELEASE, 1), "pending", "applied"), (key(RELEASE, 2), "pending", "skipped"),
                     (key(RELEASE, 3), "pending", "skipped")]
    assert outcomes == [(key(RELEASE, 1), "applied"), (key(RELEASE, 2), "skipped"), (key(RELEASE, 3), "skipped")]


def test_a_batch_of_first_deliveries_takes_a_fixed_few_statements(db_url):
    """N due first deliveries: the same few statements whatever N, and one write of the ledger
    (each row inserted once, already applied); the careful path takes more and writes each row three
    times (insert pending, claim, finish)."""
    engine = make_engine(db_url)
    kinds = demo_kinds(engine)
    small = counted_statements(engine, kinds, 20, fast=True, first_id=1)
    large = counted_statements(engine, kinds, 300, fast=True, first_id=1000)
    careful = counted_statements(engine, kinds, 300, fast=False, first_id=5000)
    assert len(small) == len(large)
    # The batch's own and the pauses read once; SQLite writes transitions and outbox apart.
    assert sum("lapse_pauses" in statement for statement in large) == 1
    # PostgreSQL: the business rows, the pauses, then one statement for the ledger rows, the effect,
    # transitions and outcomes. SQLite writes the ledger rows, runs the effect and records each
    # apart, and moves waiting rows and inserts first deliveries apart (no rows are moved here).
    assert len(large) == (3 if db_url.startswith("postgresql") else 7)
    writes = ledger_writes(large)
    if db_url.startswith("postgresql"):
        assert len(writes) == 1 and "INSERT INTO" in writes[0] and "UPDATE reservations" in writes[0]
    else:
        assert [w.split()[0] for w in writes] == ["UPDATE", "INSERT"]
    assert len(ledger_writes(careful)) == 3
    assert len(careful) > len(large)


def test_a_fast_and_a_careful_worker_racing_apply_each_key_once(pg_url):
    """Two transactions take the same first deliveries at once, one on the fast path and one on the
    careful path alone: each key is applied once, with one transition and one outcome. (The fast
    path locks the ledger key before the business row, as the careful path does, so the two cannot
    deadlock each other.)"""
    engine = make_engine(pg_url)
    kinds = demo_kinds(engine)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in range(1, 201)])
    events = [release_event(rid) for rid in range(1, 201)]
    assert_each_applied_once(engine, race_fast_and_careful(engine, kinds, events), events)
