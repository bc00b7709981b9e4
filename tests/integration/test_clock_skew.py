"""One clock, the database's (docs/design/clock.md): cleanup workers and delay workers whose wall
clocks are 300 s fast and 300 s slow, next to a normal one, over holds falling due across 75 s,
change no business row before its due time by the database's clock, change each due row once, and
the slow worker applies due work. A trigger on the business table records `clock_timestamp()`."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text

from lapse.devtools.demo_data import add_reservations
from lapse.kernel import ledger
from lapse.kernel.clock import database_now
from lapse.kernel.delays import delay_record
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.processors.delay_worker import DelayWorker
from tests.fixtures.changes import changes, record_changes
from tests.fixtures.pipeline import produce
from tests.fixtures.polling import eventually
from tests.fixtures.processes import ASSIGNED, RoleProcesses
from tests.fixtures.workers import ledger_all_terminal, running_workers

HOLDS = 60
FIRST_DUE_S, SPREAD_S = 20.0, 75.0  # the four minutes, shortened: the meaning is the same
SKEW_S = 300.0
EXIT_BOUND_S = 30.0


@pytest.mark.slow
def test_skewed_workers_change_nothing_early_and_apply_due_work(pipeline, tmp_path):
    record_changes(pipeline.engine)
    procs = RoleProcesses(pipeline.settings, tmp_path, runtime__clock_check_interval_s=5)
    try:
        procs.start("process", runtime__worker_id="normal")
        procs.start("process", skew_s=SKEW_S, runtime__worker_id="fast")
        slow = procs.start("process", skew_s=-SKEW_S, runtime__worker_id="slow")
        fast_delay = procs.start("delay", skew_s=SKEW_S, runtime__worker_id="fast-delay")
        procs.start("delay", skew_s=-SKEW_S, runtime__worker_id="slow-delay")
        eventually(lambda: all(p.said(ASSIGNED) for p in procs.running("process")), timeout_s=90,
                   what="three cleanup workers in the group")
        # The skew took: each shifted process measured it and said so at its start.
        eventually(lambda: slow.said("worker=slow skew_s=-3") and fast_delay.said("worker=fast-delay skew_s=29"),
                   timeout_s=30,
                   what="the skewed processes' warnings")

        with pipeline.engine.begin() as conn:
            start = database_now(conn)
            ids = [add_reservations(conn, 1, tenant="t1", expires_at=start + timedelta(
                seconds=FIRST_DUE_S + SPREAD_S * i / HOLDS))[0] for i in range(HOLDS)]
            due = dict(conn.execute(text("SELECT id, expires_at FROM reservations")).all())
        # The publish API's events: due later, so the workers send them through the delay tiers.
        produce(pipeline, [ledger.expiry_event("release-reservation", rid, "t1", due[rid], source="app",
                                               correlation_id=f"corr-{rid}") for rid in ids])

        eventually(lambda: ledger_all_terminal(pipeline.engine, terminal=HOLDS), timeout_s=FIRST_DUE_S + SPREAD_S + 150,
                   interval_s=2.0, what=f"{HOLDS} holds released")
        running = procs.running()
        assert len(running) == 5, "a worker exited:\n" + "\n".join(p.tail() for p in procs.started)
        for role in running:
            role.terminate()
        for role in running:
            assert role.wait_exit(EXIT_BOUND_S) == 0, role.tail()
    finally:
        procs.close()

    with pipeline.engine.connect() as conn:
        states = dict(conn.execute(select(cleanup_ledger.c.state, func.count()).group_by(cleanup_ledger.c.state)).all())
        appliers = Counter(conn.execute(select(ledger_transitions.c.actor)
                                        .where(ledger_transitions.c.to_state == "applied")).scalars())
    changed = changes(pipeline.engine)
    early = [(rid, at - due[rid]) for rid, _, at in changed if at < due[rid]]
    assert early == [], f"business rows changed before their due time by the database's clock: {early}"
    assert Counter(rid for rid, _, _ in changed) == Counter(ids), "each due row changed exactly once"
    assert {status for _, status, _ in changed} == {"released"}
    assert states == {"applied": HOLDS}
    assert appliers["slow"] > 0, f"the slow worker applied nothing: {appliers}"


@pytest.mark.slow
def test_the_processor_sends_an_early_release_back_and_applies_a_late_one_at_once(pipeline):
    """A delay worker whose clock runs 300 s fast and is not corrected (before its first measurement,
    or with the database away) releases a wake-up 20 s early: the processor, on the database's
    clock, sends it back to a tier, round after round, and changes the row only once it is due; a
    wake-up released 5 minutes late is applied at once."""
    s = pipeline.settings
    record_changes(pipeline.engine)
    with pipeline.engine.begin() as conn:
        start = database_now(conn)
        early, late = (add_reservations(conn, 1, tenant="t1", expires_at=start + delta)[0]
                       for delta in (timedelta(seconds=20), -timedelta(minutes=5)))
        due = dict(conn.execute(text("SELECT id, expires_at FROM reservations")).all())
    producer = make_producer(s)
    for rid in (early, late):
        event = ledger.expiry_event("release-reservation", rid, "t1", due[rid], source="app")
        tier, headers = delay_record(s.topology, due[rid], start)
        producer.produce(tier, key=event.op_key.encode(), headers=headers,
                         value=pipeline.codec.encode(EXPIRY_EVENT, ledger.expiry_record(event, start)))
    assert producer.flush(10) == 0

    fast = DelayWorker(s, clock=lambda: datetime.now(UTC) + timedelta(seconds=SKEW_S))
    forwarding = threading.Thread(target=fast.run, name="fast-delay-worker")
    forwarding.start()
    try:
        with running_workers(s) as workers:
            eventually(lambda: (workers.check(), len(changes(pipeline.engine)) == 2)[1], timeout_s=90,
                       interval_s=0.5, what="both rows released")
            late_changed = changes(pipeline.engine)[0]
    finally:
        fast.stop.set()
        forwarding.join(30)

    changed = {rid: at for rid, _, at in changes(pipeline.engine)}
    assert late_changed[0] == late and late_changed[2] < due[early], "the late one was applied at once"
    assert changed[early] >= due[early], "the early release changed nothing before its due time"
    assert fast.forwarded > 2, "the early wake-up came back from the processor and was released again"
    with pipeline.engine.connect() as conn:
        assert dict(conn.execute(select(cleanup_ledger.c.state, func.count())
                                 .group_by(cleanup_ledger.c.state)).all()) == {"applied": 2}
