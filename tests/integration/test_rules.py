"""The cleanup rules on a real database, no broker: claim, effect, ledger, outbox."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, text, update

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import ExpiryEvent, expiry_event
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.processors.commit import isolate_failures
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchScope
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.topology import repo_topology, tier_covering

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TENANT = "t1"  # the events' tenant: a reservation of another tenant would be a dead letter
TOPOLOGY = repo_topology()


def event(rid: int | str, due_at: datetime = NOW - timedelta(minutes=5)) -> ExpiryEvent:
    return expiry_event("release-reservation", rid, TENANT, due_at, source="sweep", correlation_id=f"c-{rid}")


def run(engine, events, worker="w1", now=NOW):
    with engine.begin() as conn:
        return apply_batch(BatchScope(conn, kinds=demo_kinds(conn), topics=TOPOLOGY, worker=worker, now=now,
                                      lease=LEASE), events)


def ledger(engine, rid):
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger).where(
            cleanup_ledger.c.op_key == f"release-reservation:{rid}")).mappings().one()


def test_duplicates_in_and_across_batches_apply_once(db_url):
    engine = make_engine(db_url)
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant=TENANT, expires_at=NOW - timedelta(minutes=10))
    first = run(engine, [event(rid), event(rid)])
    second = run(engine, [event(rid)])
    assert (first.applied, first.duplicates) == ([f"release-reservation:{rid}"], 1)
    assert (second.applied, second.duplicates) == ([], 1)
    row = ledger(engine, rid)
    assert (row["state"], row["attempt"], row["duplicates"]) == ("applied", 1, 2)
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.status)).scalar() == "released"
        assert conn.execute(select(func.count()).select_from(outbox)).scalar() == 1
        assert conn.execute(select(func.count()).select_from(ledger_transitions)).scalar() == 1


def test_payment_that_won_the_race_is_skipped(db_url):
    engine = make_engine(db_url)
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant=TENANT, expires_at=NOW - timedelta(minutes=10))
        conn.execute(update(reservations).values(status="paid"))
    result = run(engine, [event(rid)])
    assert result.skipped == [f"release-reservation:{rid}"]
    assert ledger(engine, rid)["state"] == "skipped"
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.status)).scalar() == "paid"
        payload = conn.execute(select(outbox.c.payload)).scalar()
    assert payload["status"] == "skipped"


def test_malformed_subject_is_dead_lettered_with_reason(db_url):
    engine = make_engine(db_url)
    result = run(engine, [event("abc")])
    assert result.dead_lettered == ["release-reservation:abc"]
    row = ledger(engine, "abc")
    assert (row["state"], row["last_failure_class"]) == ("dead_letter", "invalid")
    assert "not a numeric id" in row["last_failure"]
    with engine.connect() as conn:
        topics = sorted(conn.execute(select(outbox.c.topic)).scalars())
    assert topics == sorted([TOPOLOGY.dlq, TOPOLOGY.outcomes])


def test_future_wakeup_is_handed_back_not_applied(db_url):
    """A wake-up that came early for a reservation not due either waits for the delay tier. (One
    whose reservation is due is applied: tests/integration/test_waiting_subjects.py.)"""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant=TENANT, expires_at=NOW + timedelta(minutes=1))
    early = event(rid, due_at=NOW + timedelta(minutes=1))
    result = run(engine, [early])
    assert [e.op_key for e in result.not_due] == [early.op_key]
    assert ledger(engine, rid)["state"] == "pending"


def test_two_workers_racing_on_one_batch_apply_once(pg_url):
    """Two transactions claim the same keys at once on PostgreSQL: each key applies exactly once."""
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        ids = add_reservations(conn, 200, tenant=TENANT, expires_at=NOW - timedelta(minutes=10))
    events = [event(i) for i in ids]
    results = {}
    barrier = threading.Barrier(2)

    def worker(name):
        barrier.wait()
        results[name] = run(engine, events, worker=name)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    [t.start() for t in threads]
    [t.join() for t in threads]
    applied = results["a"].applied + results["b"].applied
    assert sorted(applied) == sorted(e.op_key for e in events)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).where(reservations.c.status == "released")).scalar() == 200
        assert conn.execute(select(func.count()).select_from(outbox)).scalar() == 200


def test_hold_extended_after_its_event_is_rescheduled_not_skipped(db_url):
    """Skipping would be terminal: the extended hold would never be released."""
    engine = make_engine(db_url)
    extended = NOW + timedelta(minutes=20)
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant=TENANT, expires_at=extended)
    result = run(engine, [event(rid)])
    assert result.rescheduled == [f"release-reservation:{rid}"] and not result.skipped
    row = ledger(engine, rid)
    assert (row["state"], row["due_at"], row["attempt"]) == ("pending", extended, 0)
    with engine.connect() as conn:
        wakeup = conn.execute(select(outbox.c.topic, outbox.c.payload)).one()
    assert wakeup.topic == tier_covering(TOPOLOGY, 20 * 60)  # the smallest tier covering 20 minutes
    assert wakeup.payload["source"] == "reschedule"
    # When the new due time comes, the wake-up releases it.
    later = run(engine, [event(rid, due_at=extended)], now=extended + timedelta(seconds=1))
    assert later.applied == [f"release-reservation:{rid}"]
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.status)).scalar() == "released"


def test_an_event_that_breaks_the_batch_transaction_is_dead_lettered_alone(pg_url):
    """One event whose effect fails in the database must not fail its batch forever: the batch
    is redone event by event and only that event is dead-lettered, with the database's reason."""
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        ids = add_reservations(conn, 15, tenant=TENANT, expires_at=NOW - timedelta(minutes=10))
    release = demo_kinds(engine)["release-reservation"]

    def release_unless_thirteen(conn, ids, now):
        """The declared release, failing in the database for one subject (division by zero)."""
        if 13 in ids:
            conn.execute(text("SELECT 1 / 0"))
        return release.apply_in_db(conn, ids, now)

    kinds = {"release-reservation": replace(release, apply_in_db=release_unless_thirteen)}
    with engine.connect() as conn:
        result = isolate_failures(BatchScope(conn, kinds=kinds, topics=TOPOLOGY, worker="w1", now=NOW,
                                             lease=LEASE), [event(i) for i in ids])
    assert sorted(result.applied) == sorted(f"release-reservation:{i}" for i in ids if i != 13)
    assert result.dead_lettered == ["release-reservation:13"]
    row = ledger(engine, 13)
    assert (row["state"], row["last_failure_class"]) == ("dead_letter", "invalid")
    assert row["last_failure"].startswith("DivisionByZero")
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.status).where(reservations.c.id == 13)).scalar() == "held"


def test_out_of_range_subject_is_invalid_not_a_database_error(db_url):
    engine = make_engine(db_url)
    result = run(engine, [event("99999999999999999999")])
    assert result.dead_lettered == ["release-reservation:99999999999999999999"]
    assert "not a numeric id" in ledger(engine, "99999999999999999999")["last_failure"]
