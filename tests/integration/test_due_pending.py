"""The fast path for waiting rows on a real database: events of `pending` ledger rows created the way
the sweep, `schedule_cleanup` and a replay create them must end exactly as on the careful path alone
(ledger rows, business rows, outbox records, transitions, the batch's classification), stay right
when a row or a business row changes under it, be undone exactly when the effect changes nothing,
and write each ledger row once in a fixed number of statements."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, insert, select, update

from lapse.devtools.demo_tables import reservations
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import (
    PENDING,
    ExpiryEvent,
    LedgerWrites,
    Selection,
    bring_forward,
    event_for_row,
    expiry_event,
    insert_pending,
    read_rows,
    release_dead_letters,
    restore_waiting,
    settle_waiting,
)
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

SUBJECTS = 6
SWEPT_AT = NOW - timedelta(seconds=30)  # when the sweep ran, before the batch
BUSINESS = ["missing", "due", "due", "due", "later", "paid"]
# How each subject's ledger row came to be before the batch (None: it has none yet):
# - "scheduled", "scheduled_later": `schedule_cleanup` (insert_pending), due before NOW or after;
# - "recheck", "recheck_later": a row waiting for its subject again, attempt 2 (as `await_subjects`
#   leaves one), written by insert_pending at that attempt;
# - "replayed": a dead letter released by an operator's replay (real `release_dead_letters`);
# - "pending_claimed": a pending row with a claim owner left on it (no writer does this; it must
#   go to the careful path all the same);
# - the rest as `test_first_delivery.ledger_row` writes them (retries, leases, terminal rows).
# The sweep then runs (its real page query, insert_pending and bring_forward) when the world says so.
LEDGER = [None, None, "scheduled", "scheduled", "scheduled_later", "recheck", "recheck_later", "replayed",
          "pending_claimed", "pending_later", "retry_scheduled", "claimed_expired", "claimed_live", "applied",
          "skipped", "dead_letter"]


def scheduled_event(subject: int, *, due: datetime, attempt: int = 0) -> ExpiryEvent:
    return expiry_event(RELEASE, subject, TENANT, due, source="publish", correlation_id=f"s-{subject}",
                        attempt=attempt)


def seed_ledger(conn: Connection, subject: int, state: str) -> None:
    early, late = NOW - timedelta(minutes=5), NOW + timedelta(hours=1)
    created = NOW - timedelta(hours=1)
    if state in ("scheduled", "scheduled_later"):
        insert_pending(conn, [scheduled_event(subject, due=late if state.endswith("later") else early)], created)
    elif state in ("recheck", "recheck_later"):
        insert_pending(conn, [scheduled_event(subject, due=late if state.endswith("later") else early,
                                              attempt=2)], created)
    elif state == "replayed":
        conn.execute(insert(cleanup_ledger), [ledger_row(RELEASE, subject, "dead_letter")])
        released = release_dead_letters(conn, Selection(op_keys=(key(RELEASE, subject),)), 10, f"r-{subject}",
                                        NOW - timedelta(minutes=1))
        assert [r.op_key for r in released] == [key(RELEASE, subject)]
    elif state == "pending_claimed":
        conn.execute(insert(cleanup_ledger), [{**ledger_row(RELEASE, subject, "pending"), "claim_owner": "w-odd"}])
    else:
        conn.execute(insert(cleanup_ledger), [ledger_row(RELEASE, subject, state)])


def sweep(conn: Connection, kind: CleanupKind, at: datetime) -> list[ExpiryEvent]:
    """What `producers.sweep.sweep_page` does in the database for one page at `at` (its page query,
    insert_pending, bring_forward and their transitions); returns the events it would emit. The
    correlation ids are fixed so that two runs of a world are the same."""
    rows = [kind.to_eligible(r) for r in conn.execute(kind.eligible_page(at, None, 1000, without_ledger=True))]
    events = [expiry_event(kind.name, r.subject_id, r.tenant, r.due_at, source="sweep",
                           correlation_id=f"sw-{r.subject_id}") for r in rows]
    created = set(insert_pending(conn, events, at))
    moved = bring_forward(conn, [e.op_key for e in events if e.op_key not in created], at)
    writes = LedgerWrites("sweep", at)
    for row in moved:
        writes.transition(row.op_key, PENDING, PENDING, row.attempt, reason="brought forward by the sweep",
                          replay_id=row.replay_id, correlation_id=row.correlation_id)
    writes.flush(conn)
    return [e for e in events if e.op_key in created] + [event_for_row(r, source="sweep") for r in moved]


def seed(conn: Connection, kinds: dict[str, CleanupKind], world: dict[str, Any]) -> list[ExpiryEvent]:
    """Business rows, ledger rows, then the sweep if the world runs it; returns what the sweep emitted."""
    seed_business(conn, world)
    for rid, state in enumerate(world["ledger"], start=1):
        if state:
            seed_ledger(conn, rid, state)
    return sweep(conn, kinds[RELEASE], SWEPT_AT) if world["sweep"] else []


def batch_events(conn: Connection, world: dict[str, Any], emitted: list[ExpiryEvent],
                 picks: list[tuple[str, Any]]) -> list[ExpiryEvent]:
    """The batch: for each pick, the event in flight for a subject's row (what the sweep emitted, or
    the row's own event as a wake-up or the reconciler carries it), or an arbitrary delivery."""
    rows = read_rows(conn, [key(RELEASE, s) for s in range(1, SUBJECTS + 1)])
    swept = {e.op_key: e for e in emitted}
    events = []
    for how, arg in picks:
        if how == "arbitrary":
            events.append(arg)
            continue
        subject, mode = arg
        k = key(RELEASE, subject)
        if mode == "swept" and k in swept:
            events.append(swept[k])
        elif k in rows:
            events.append(event_for_row(rows[k], source="reconcile"))
        else:
            events.append(release_event(subject))
    if world["artifacts"]:
        events += [expiry_event(DELETE, 1, TENANT, NOW - timedelta(minutes=1), source="sweep", correlation_id="c-a1"),
                   expiry_event(DELETE, 2, TENANT, NOW - timedelta(minutes=1), source="sweep", correlation_id="c-a2")]
    return events


def run_world(engine, kinds, world: dict[str, Any], picks, *, fast: bool) -> dict[str, Any]:
    """Seed `world`, run the batch (with or without the fast path), snapshot, roll everything back."""
    return rolled_back_batch(engine, kinds, lambda conn: batch_events(conn, world, seed(conn, kinds, world), picks),
                             fast=fast)


def arbitrary_event(subject: int | str, due_later: bool, attempt: int, tenant: str, replay: bool) -> ExpiryEvent:
    event = release_event(subject, due_later=due_later, attempt=attempt, tenant=tenant)
    return event._replace(replay_id=f"r-{subject}") if replay else event


picks_strategy = st.lists(st.one_of(
    st.tuples(st.just("row"), st.tuples(st.integers(1, SUBJECTS), st.sampled_from(["swept", "row"]))),
    st.tuples(st.just("arbitrary"), st.builds(
        arbitrary_event, st.one_of(st.integers(1, SUBJECTS), st.just("abc")), st.booleans(), st.integers(0, 3),
        st.sampled_from([TENANT, TENANT, TENANT, "t2"]), st.booleans()))),
    min_size=1, max_size=14)
worlds = world_strategy(SUBJECTS, BUSINESS, LEDGER, sweep=st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=worlds, picks=picks_strategy)
def test_waiting_rows_end_as_on_the_careful_path(db_url, world, picks):
    """Mixed batches over rows the sweep, `schedule_cleanup` and replays create — due and not due,
    with and without replay ids, at attempt 0 and after rechecks — and over retries, live and
    expired leases, terminal rows, first deliveries, stale and arbitrary redeliveries, other
    tenants, malformed subjects, external-effect kinds and in-batch duplicates end the same with the
    fast path as with the careful path alone."""
    engine = engine_for(db_url)
    kinds = kinds_for(db_url)
    careful = run_world(engine, kinds, world, picks, fast=False)
    fast = run_world(engine, kinds, world, picks, fast=True)
    assert fast == careful


def test_swept_rows_are_applied_with_one_transition_and_outcome_each(db_url):
    """The common case: the sweep's rows, due, end applied at attempt 1 with one transition
    pending → applied and one outcome carrying the sweep's correlation id; a recheck row at attempt
    2 and a replayed row end at the careful path's attempts, with its replay id."""
    engine = engine_for(db_url)
    kinds = kinds_for(db_url)
    with engine.connect() as conn, conn.begin() as trans:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2, 3, 4, 5)])
        seed_ledger(conn, 4, "recheck")
        seed_ledger(conn, 5, "replayed")
        emitted = sweep(conn, kinds[RELEASE], SWEPT_AT)
        assert sorted(e.op_key for e in emitted) == [key(RELEASE, r) for r in (1, 2, 3)]
        rows = read_rows(conn, [key(RELEASE, 4), key(RELEASE, 5)])
        events = [*emitted, emitted[1], event_for_row(rows[key(RELEASE, 4)], source="retry"),
                  event_for_row(rows[key(RELEASE, 5)], source="replay")]
        result = apply_batch(scope(conn, kinds), events)
        assert sorted(result.applied) == [key(RELEASE, r) for r in (1, 2, 3, 4, 5)]
        assert result.duplicates == 1
        ledger = {r.op_key: r for r in conn.execute(select(cleanup_ledger))}
        steps = sorted(conn.execute(select(
            ledger_transitions.c.op_key, ledger_transitions.c.from_state, ledger_transitions.c.to_state,
            ledger_transitions.c.attempt, ledger_transitions.c.replay_id).where(ledger_transitions.c.at == NOW)))
        outcomes = sorted((k, p["status"], p["attempt"], p["correlation_id"], p["replay_id"])
                          for k, p in conn.execute(select(outbox.c.key, outbox.c.payload)))
        trans.rollback()
    assert {(k, r.state, r.attempt, r.duplicates, r.finished_at, r.updated_at, r.claim_owner)
            for k, r in ledger.items()} == {
        (key(RELEASE, 1), "applied", 1, 0, NOW, NOW, None), (key(RELEASE, 2), "applied", 1, 1, NOW, NOW, None),
        (key(RELEASE, 3), "applied", 1, 0, NOW, NOW, None), (key(RELEASE, 4), "applied", 3, 0, NOW, NOW, None),
        (key(RELEASE, 5), "applied", 1, 0, NOW, NOW, None)}
    assert steps == [(key(RELEASE, 1), "pending", "applied", 1, None), (key(RELEASE, 2), "pending", "applied", 1, None),
                     (key(RELEASE, 3), "pending", "applied", 1, None), (key(RELEASE, 4), "pending", "applied", 3, None),
                     (key(RELEASE, 5), "pending", "applied", 1, "r-5")]
    assert outcomes == [(key(RELEASE, 1), "applied", 1, "sw-1", None), (key(RELEASE, 2), "applied", 1, "sw-2", None),
                        (key(RELEASE, 3), "applied", 1, "sw-3", None), (key(RELEASE, 4), "applied", 3, "s-4", None),
                        (key(RELEASE, 5), "applied", 1, "old-5", "r-5")]


def test_an_undone_move_puts_the_row_back_as_it_was(db_url):
    """`restore_waiting` after `settle_waiting` leaves every column as it was but `updated_at`,
    which the careful path's claim writes next in the same transaction."""
    engine = engine_for(db_url)
    with engine.connect() as conn, conn.begin() as trans:
        seed_ledger(conn, 1, "recheck")
        seed_ledger(conn, 2, "replayed")
        keys = [key(RELEASE, 1), key(RELEASE, 2)]
        before = [dict(r) for r in conn.execute(select(cleanup_ledger).order_by(cleanup_ledger.c.op_key)).mappings()]
        moved = settle_waiting(conn, keys, NOW)
        assert {k: (r.state, r.attempt) for k, r in moved.items()} == {keys[0]: ("applied", 3), keys[1]: ("applied", 1)}
        assert restore_waiting(conn, keys, NOW) == 2
        after = [dict(r) for r in conn.execute(select(cleanup_ledger).order_by(cleanup_ledger.c.op_key)).mappings()]
        trans.rollback()
    assert after == [{**row, "updated_at": NOW} for row in before]


def swept_statements(engine, kinds, n: int, *, fast: bool, first_id: int) -> list[str]:
    """The statements one batch of the sweep's `n` due events executes (apply_batch only)."""
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(first_id + i) for i in range(n)])
    with engine.begin() as conn:
        emitted = [e for e in sweep(conn, kinds[RELEASE], SWEPT_AT) if int(e.subject_id) >= first_id]
    assert len(emitted) == n
    return batch_statements(engine, kinds, emitted, fast=fast)


def test_a_batch_of_swept_rows_takes_a_fixed_few_statements(db_url):
    """N due swept events: the same few statements whatever N, and one write of the ledger (each
    row moved once, pending → applied); the careful path takes more and writes each row three times
    (insert pending, a no-op here; claim; finish)."""
    engine = engine_for(db_url)
    kinds = demo_kinds(engine)
    small = swept_statements(engine, kinds, 20, fast=True, first_id=1)
    large = swept_statements(engine, kinds, 300, fast=True, first_id=1000)
    careful = swept_statements(engine, kinds, 300, fast=False, first_id=5000)
    assert len(small) == len(large)
    # The batch's own and the pauses read once; SQLite writes transitions and outbox apart.
    assert sum("lapse_pauses" in statement for statement in large) == 1
    # PostgreSQL: the business rows, the pauses, then one statement for the ledger rows, the effect,
    # transitions and outcomes (SQLite runs the effect and writes those two apart).
    assert len(large) == (3 if db_url.startswith("postgresql") else 6)
    writes = ledger_writes(large)
    assert len(writes) == 1 and "UPDATE" in writes[0]
    assert len(ledger_writes(careful)) == 3
    assert len(careful) == (8 if db_url.startswith("postgresql") else 9)
    # First deliveries take as many on PostgreSQL; SQLite inserts them apart from its move.
    first = counted_statements(engine, kinds, 20, fast=True, first_id=9000)
    assert len(first) == len(large) + (0 if db_url.startswith("postgresql") else 1)


def test_a_business_row_that_changes_before_the_effect_is_undone_and_skipped(db_url):
    """A payment lands between the fast path's read and its effect on a swept row: the move is
    undone and the careful path records the operation skipped, with the rows it records when the
    payment came first."""
    engine = engine_for(db_url)
    release = kinds_for(db_url)[RELEASE]
    kinds = paid_before_the_effect(release, 2)
    with engine.connect() as conn, conn.begin() as trans:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2)])
        seed_ledger(conn, 2, "recheck")
        emitted = sweep(conn, release, SWEPT_AT)
        events = [*emitted, event_for_row(read_rows(conn, [key(RELEASE, 2)])[key(RELEASE, 2)], source="retry")]
        result = apply_batch(scope(conn, kinds), events)
        state = {r.op_key: (r.state, r.attempt, r.finished_at, r.updated_at, r.claim_owner, r.claim_until)
                 for r in conn.execute(select(cleanup_ledger))}
        steps = sorted(conn.execute(select(ledger_transitions.c.op_key, ledger_transitions.c.from_state,
                                           ledger_transitions.c.to_state, ledger_transitions.c.attempt)
                                    .where(ledger_transitions.c.at == NOW)).all())
        outcomes = sorted((k, p["status"], p["attempt"])
                          for k, p in conn.execute(select(outbox.c.key, outbox.c.payload)))
        trans.rollback()
    assert (result.applied, result.skipped) == ([key(RELEASE, 1)], [key(RELEASE, 2)])
    assert state == {key(RELEASE, 1): ("applied", 1, NOW, NOW, None, None),
                     key(RELEASE, 2): ("skipped", 3, NOW, NOW, None, None)}
    assert steps == [(key(RELEASE, 1), "pending", "applied", 1), (key(RELEASE, 2), "pending", "skipped", 3)]
    assert outcomes == [(key(RELEASE, 1), "applied", 1), (key(RELEASE, 2), "skipped", 3)]


def test_a_row_that_moves_away_and_back_under_the_fast_path_goes_to_the_careful_path(pg_url):
    """Between the probe and the move, other transactions take a waiting row through a dead letter
    and an operator's replay (pending again, due, attempt 0, a replay id): the fast path sees the
    row it moved is not the one it probed, undoes the move, and the careful path applies it at the
    attempt the row then has."""
    engine = engine_for(pg_url)
    release = kinds_for(pg_url)[RELEASE]
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2)])
        seed_ledger(conn, 2, "recheck")  # attempt 2
        emitted = sweep(conn, release, SWEPT_AT)
    k2 = key(RELEASE, 2)
    replayed: list[str] = []

    def parse_after_a_replay(subject_id: str) -> Any:
        if not replayed:
            with engine.begin() as rival:
                rival.execute(update(cleanup_ledger).where(cleanup_ledger.c.op_key == k2)
                              .values(state="dead_letter", finished_at=NOW - timedelta(seconds=2)))
                replayed.extend(r.op_key for r in release_dead_letters(
                    rival, Selection(op_keys=(k2,)), 1, "r-late", NOW - timedelta(seconds=1)))
        return release.parse_subject(subject_id)

    kinds = {RELEASE: replace(release, parse_subject=parse_after_a_replay)}
    with engine.begin() as conn:
        probe = read_rows(conn, [k2])[k2]
        result = apply_batch(scope(conn, kinds), [*emitted, event_for_row(probe, source="retry")])
    assert replayed == [k2]
    assert sorted(result.applied) == [key(RELEASE, 1), k2]
    with engine.connect() as conn:
        row = conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == k2)).mappings().one()
        steps = conn.execute(select(ledger_transitions.c.from_state, ledger_transitions.c.to_state,
                                    ledger_transitions.c.attempt).where(ledger_transitions.c.op_key == k2)).all()
        assert conn.execute(select(reservations.c.status)).scalars().all() == ["released"] * 2
    assert (row["state"], row["attempt"], row["replay_id"], row["updated_at"]) == ("applied", 1, "r-late", NOW)
    assert steps == [("pending", "applied", 1)]


def test_a_row_claimed_concurrently_is_waited_for_and_absorbed(pg_url):
    """A rival transaction claims a swept row and applies it while the fast path runs: the fast
    path's move waits for it, leaves that key out, and the event is a duplicate."""
    engine = engine_for(pg_url)
    kinds = kinds_for(pg_url)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in (1, 2)])
        emitted = sweep(conn, kinds[RELEASE], SWEPT_AT)
    raced = next(e for e in emitted if e.subject_id == "2")
    results: dict[str, BatchResult] = {}
    with engine.connect() as rival:
        trans = rival.begin()
        results["rival"] = apply_batch(scope(rival, kinds, worker="w2"), [raced], fast_path=False)

        def worker() -> None:
            with engine.begin() as conn:
                results["fast"] = apply_batch(scope(conn, kinds), emitted)

        thread = threading.Thread(target=worker)
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive()  # waiting on the rival's row
        trans.commit()
        thread.join(30)
    assert results["rival"].applied == [raced.op_key]
    assert (results["fast"].applied, results["fast"].duplicates) == ([key(RELEASE, 1)], 1)
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.status)).scalars().all() == ["released"] * 2
        assert sorted(conn.execute(select(outbox.c.key)).scalars()) == [key(RELEASE, 1), raced.op_key]


def test_a_fast_and_a_careful_worker_racing_on_swept_rows_apply_each_key_once(pg_url):
    """Two transactions take the same swept events at once, one on the fast path and one on the
    careful path alone: each key is applied once, with one transition and one outcome, and neither
    deadlocks (both lock the ledger row before the business row)."""
    engine = engine_for(pg_url)
    kinds = kinds_for(pg_url)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(rid) for rid in range(1, 201)])
        events = sweep(conn, kinds[RELEASE], SWEPT_AT)
    random.Random(3).shuffle(events)
    assert_each_applied_once(engine, race_fast_and_careful(engine, kinds, events), events)
