"""The business row, not the event, says when work is due: an event due in 2100, one that came
before its subject existed, or before it was due, never makes a terminal row and never keeps a due
subject from being cleaned up; and an event must name its business row's tenant. Real PostgreSQL
(and SQLite where no broker is needed), `apply_batch` on a fake clock, the sweep and the reconciler
on Apache Kafka where they matter. Final state: ledger rows, transitions, business rows, outbox."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, insert, select

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import ExpiryEvent, expiry_event, insert_pending, pending_row
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.topology import Topology
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchResult, BatchScope
from lapse.producers.sweep import sweep_once
from lapse.reconciler.scan import Reconciler
from tests.fixtures.kafka import read_topic
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.topology import repo_topology

KIND = "release-reservation"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
FAR = datetime(2100, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TENANT = "acme"


def event(rid: int, due_at: datetime, tenant: str = TENANT) -> ExpiryEvent:
    return expiry_event(KIND, rid, tenant, due_at, source="sweep", correlation_id=f"c-{rid}")


def key(rid: int) -> str:
    return f"{KIND}:{rid}"


def run(engine, events, now, topics: Topology | None = None, kinds=None, fast_path: bool = True) -> BatchResult:
    with engine.begin() as conn:
        return apply_batch(BatchScope(conn, kinds=kinds or demo_kinds(conn), topics=topics or repo_topology(),
                                      worker="w1", now=now, lease=LEASE), events, fast_path=fast_path)


def reservation(engine, rid: int, expires_at: datetime, tenant: str = TENANT) -> None:
    """A held reservation with a chosen id (the event for it may have come first)."""
    with engine.begin() as conn:
        conn.execute(insert(reservations).values(id=rid, tenant=tenant, status="held", expires_at=expires_at))


def ledger(engine, rid: int):
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == key(rid))).mappings().one()


def status(engine, rid: int) -> str:
    with engine.connect() as conn:
        return conn.execute(select(reservations.c.status).where(reservations.c.id == rid)).scalar_one()


def moves(engine, rid: int) -> list[tuple[str | None, str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(ledger_transitions.c.from_state, ledger_transitions.c.to_state, ledger_transitions.c.actor)
            .where(ledger_transitions.c.op_key == key(rid)).order_by(ledger_transitions.c.id))]


def outcomes(engine, topics: Topology) -> list[str]:
    with engine.connect() as conn:
        return [p["status"] for p in conn.execute(
            select(outbox.c.payload).where(outbox.c.topic == topics.outcomes).order_by(outbox.c.id)).scalars()]


def wake_ups(engine, topics: Topology) -> list[dict]:
    """Expiry events the processor put on a delay tier through the outbox, oldest first."""
    tiers = [spec.name for spec in topics.specs if spec.delay_seconds is not None]
    with engine.connect() as conn:
        return list(conn.execute(select(outbox.c.payload).where(outbox.c.topic.in_(tiers))
                                 .order_by(outbox.c.id)).scalars())


def parked(engine, rid: int, due_at: datetime) -> None:
    """A `pending` row waiting for `due_at`, as an earlier version left one for an event due then."""
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), [pending_row(event(rid, due_at), NOW)])


def from_payload(payload: dict) -> ExpiryEvent:
    """The event of an outbox payload (timestamps in epoch milliseconds) or a decoded record."""
    record = {name: datetime.fromtimestamp(value / 1000, UTC) if name in ("due_at", "produced_at")
              and isinstance(value, int) else value for name, value in payload.items()}
    return ExpiryEvent.from_record(record, NOW)


# The processor alone ------------------------------------------------------------------------------

def test_event_due_in_2100_for_a_due_reservation_is_released_once_by_the_processor(db_url):
    engine = make_engine(db_url)
    topics = repo_topology()
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant=TENANT, expires_at=NOW - timedelta(minutes=10))
    first = run(engine, [event(rid, FAR)], NOW)
    again = run(engine, [event(rid, FAR), event(rid, NOW - timedelta(minutes=10))], NOW + timedelta(seconds=5))
    assert first.applied == [key(rid)] and not first.not_due
    assert again.applied == [] and again.duplicates == 2
    assert status(engine, rid) == "released"
    assert ledger(engine, rid)["state"] == "applied"
    assert moves(engine, rid) == [("pending", "pending", "w1"), ("pending", "applied", "w1")]
    assert outcomes(engine, topics) == ["applied"]


@pytest.mark.parametrize("event_due", [NOW - timedelta(minutes=5), FAR], ids=["past", "2100"])
def test_event_before_its_reservation_is_due_waits_for_it_and_releases_it_when_due(db_url, event_due):
    engine = make_engine(db_url)
    topics = repo_topology()
    due = NOW + timedelta(minutes=20)
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant=TENANT, expires_at=due)
    early = run(engine, [event(rid, event_due)], NOW)
    assert early.rescheduled == [key(rid)] and not early.skipped
    row = ledger(engine, rid)
    assert (row["state"], row["due_at"]) == ("pending", due)  # the reservation's time, not the event's
    (wake,) = wake_ups(engine, topics)
    assert wake["due_at"] == int(due.timestamp() * 1000)
    done = run(engine, [from_payload(wake)], due + timedelta(seconds=1))
    assert done.applied == [key(rid)]
    assert status(engine, rid) == "released"
    assert outcomes(engine, topics) == ["applied"]


def test_event_before_its_reservation_existed_waits_then_releases_it_on_its_recheck(db_url):
    engine = make_engine(db_url)
    topics = repo_topology()
    release = demo_kinds(engine)[KIND]
    rid = 42
    first = run(engine, [event(rid, NOW - timedelta(minutes=5))], NOW)
    assert first.rescheduled == [key(rid)] and not first.skipped
    recheck = NOW + timedelta(seconds=release.retry_cap_s)
    row = ledger(engine, rid)
    assert (row["state"], row["due_at"], row["attempt"]) == ("pending", recheck, 1)
    (wake,) = wake_ups(engine, topics)
    assert (wake["source"], wake["attempt"]) == ("recheck", 1)
    reservation(engine, rid, NOW + timedelta(minutes=1))
    done = run(engine, [from_payload(wake)], recheck + timedelta(seconds=1))
    assert done.applied == [key(rid)]
    assert status(engine, rid) == "released"
    assert ledger(engine, rid)["state"] == "applied"
    assert outcomes(engine, topics) == ["applied"]


def test_subject_that_never_appears_is_rechecked_a_bounded_number_of_times_then_skipped(db_url):
    engine = make_engine(db_url)
    topics = repo_topology()
    release = demo_kinds(engine)[KIND]
    now, pending = NOW, [event(7, NOW - timedelta(minutes=5))]
    for _ in range(release.max_attempts):
        result = run(engine, pending, now)
        if result.skipped:
            break
        now += timedelta(seconds=release.retry_cap_s + 1)
        pending = [from_payload(wake_ups(engine, topics)[-1])]
    assert result.skipped == [key(7)]
    row = ledger(engine, 7)
    assert (row["state"], row["attempt"]) == ("skipped", release.max_attempts)
    assert len(wake_ups(engine, topics)) == release.max_attempts - 1
    assert outcomes(engine, topics) == ["skipped"]


def test_event_due_in_2100_for_a_missing_or_paid_subject_does_not_wait_for_2100(db_url):
    """No business row: the bounded rechecks start now; a paid one: skipped now, as when due."""
    engine = make_engine(db_url)
    release = demo_kinds(engine)[KIND]
    with engine.begin() as conn:
        (paid,) = add_reservations(conn, 1, tenant=TENANT, status="paid", expires_at=NOW + timedelta(days=1))
    missing = paid + 1
    result = run(engine, [event(missing, FAR), event(paid, FAR)], NOW)
    assert (result.rescheduled, result.skipped, result.not_due) == ([key(missing)], [key(paid)], [])
    row = ledger(engine, missing)
    assert (row["state"], row["due_at"]) == ("pending", NOW + timedelta(seconds=release.retry_cap_s))
    assert status(engine, paid) == "paid"
    # A duplicate of the event while the recheck waits does not use a recheck up.
    again = run(engine, [event(missing, FAR)], NOW + timedelta(minutes=1))
    assert (again.duplicates, again.rescheduled, again.not_due) == (1, [], [])
    assert ledger(engine, missing)["attempt"] == 1


def test_a_forged_tenant_is_poison_that_never_occupies_the_real_subjects_operation(db_url):
    """An event naming a tenant that is not its business row's makes no ledger row (its record
    goes to the DLQ as poison, `tenant_mismatch`): the real subject's event then applies it, once."""
    engine = make_engine(db_url)
    topics = repo_topology()
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant="acme", expires_at=NOW - timedelta(minutes=10))
    long_tenant = "globex-" + "x" * 57  # 64 characters, the most a tenant holds
    for fast_path in (True, False):
        forged = run(engine, [event(rid, NOW - timedelta(minutes=10), tenant=long_tenant)], NOW,
                     fast_path=fast_path)
        assert [e.op_key for e, _ in forged.forged] == [key(rid)] and not forged.applied
        (reason,) = [r for _, r in forged.forged]
        assert reason.startswith(f"tenant mismatch: the event says {long_tenant!r}, the business row says 'acme'")
        with engine.connect() as conn:
            assert conn.execute(select(cleanup_ledger)).all() == []  # nothing occupies the op key
            assert conn.execute(select(outbox)).all() == []
        assert status(engine, rid) == "held"

    real = run(engine, [event(rid, NOW - timedelta(minutes=10), tenant="acme")], NOW)
    assert real.applied == [key(rid)]
    assert status(engine, rid) == "released" and outcomes(engine, topics) == ["applied"]


def test_work_recorded_under_a_wrong_tenant_before_the_check_goes_on_under_the_business_rows(db_url):
    """A ledger row made with the event's wrong tenant before it could be checked (while its kind
    was undeclared, or by an older version): its event is the business row's work, applied once
    under the business row's tenant, not poison that would leave the row waiting for ever."""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant="acme", expires_at=NOW - timedelta(minutes=10))
    wrong = event(rid, NOW - timedelta(minutes=10), tenant="globex")
    with engine.begin() as conn:
        insert_pending(conn, [wrong], NOW)
    done = run(engine, [wrong], NOW)
    assert done.applied == [key(rid)] and done.forged == []
    assert status(engine, rid) == "released" and ledger(engine, rid)["state"] == "applied"


# The sweep and the reconciler ---------------------------------------------------------------------

def emitted(p) -> list[ExpiryEvent]:
    records = read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.expiry)
    return [from_payload(p.codec.decode_expected("expiry_event", m.value())) for m in records]


def parked_behind_a_due_reservation(p, rid: int) -> dict:
    """A row left waiting for 2100 whose reservation is due a minute from NOW; the demo's kinds."""
    parked(p.engine, rid, FAR)
    reservation(p.engine, rid, NOW + timedelta(minutes=1))
    return load_kinds(p.settings, p.engine)


def apply_the_one_emitted(p, kinds, rid: int, at: datetime) -> ExpiryEvent:
    """Process the single event emitted to the expiry topic at `at`: its reservation is released."""
    (sent,) = emitted(p)
    done = run(p.engine, [sent], at, p.settings.topology, kinds)
    assert done.applied == [key(rid)]
    assert status(p.engine, rid) == "released"
    return sent


def test_sweep_emits_a_due_reservation_whose_row_waits_for_2100_once(pipeline):
    p = pipeline
    rid = 5
    kinds = parked_behind_a_due_reservation(p, rid)
    later = NOW + timedelta(minutes=2)
    producer = make_producer(p.settings)
    first = sweep_once(p.engine, producer, p.codec, p.settings, kinds, clock=lambda: later)
    second = sweep_once(p.engine, producer, p.codec, p.settings, kinds, clock=lambda: later + timedelta(seconds=5))
    assert (first.emitted, second.emitted) == (1, 0)
    row = ledger(p.engine, rid)
    assert (row["state"], row["due_at"]) == ("pending", later)
    apply_the_one_emitted(p, kinds, rid, later + timedelta(seconds=1))
    assert moves(p.engine, rid) == [("pending", "pending", "sweep"), ("pending", "applied", "w1")]
    assert outcomes(p.engine, p.settings.topology) == ["applied"]


def test_sweep_emits_a_reservation_that_appeared_after_its_event_as_soon_as_it_is_due(pipeline):
    p = pipeline
    kinds = load_kinds(p.settings, p.engine)
    rid = 9
    run(p.engine, [event(rid, NOW - timedelta(minutes=5))], NOW, p.settings.topology, kinds)
    assert (ledger(p.engine, rid)["state"], ledger(p.engine, rid)["attempt"]) == ("pending", 1)
    reservation(p.engine, rid, NOW + timedelta(minutes=3))
    producer = make_producer(p.settings)
    not_yet = sweep_once(p.engine, producer, p.codec, p.settings, kinds, clock=lambda: NOW + timedelta(minutes=1))
    due = NOW + timedelta(minutes=4)  # long before the recheck
    report = sweep_once(p.engine, producer, p.codec, p.settings, kinds, clock=lambda: due)
    assert (not_yet.emitted, report.emitted) == (0, 1)
    sent = apply_the_one_emitted(p, kinds, rid, due + timedelta(seconds=1))
    assert sent.attempt == 1  # the row's attempt: not taken for a stale wake-up
    assert outcomes(p.engine, p.settings.topology) == ["applied"]


def test_reconciler_brings_forward_a_due_reservation_whose_row_waits_for_2100(pipeline):
    p = pipeline
    rid = 11
    kinds = parked_behind_a_due_reservation(p, rid)
    later = NOW + timedelta(hours=1)
    rec = Reconciler(p.engine, make_producer(p.settings), p.codec, p.settings, kinds, clock=lambda: later)
    first, second = rec.run_once(), rec.run_once()
    assert first.gaps == {"waiting_past_due": 1} and first.reemitted == 1
    assert second.reemitted == 0
    apply_the_one_emitted(p, kinds, rid, later + timedelta(seconds=1))
    with p.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar() == 1
    assert moves(p.engine, rid) == [("pending", "pending", "reconciler"), ("pending", "applied", "w1")]
