"""One clock, the database's (docs/design/clock.md): cleanup workers and delay workers whose wall
clocks are 300 s fast and 300 s slow, next to a normal one, over holds falling due across 75 s,
change no business row before its due time by the database's clock, change each due row once, and
the slow worker applies due work. A trigger on the business table records `clock_timestamp()`."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from lapse.devtools.demo_data import add_reservations
from lapse.kernel import ledger
from lapse.kernel.clock import database_now
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from tests.fixtures.pipeline import produce
from tests.fixtures.polling import eventually
from tests.fixtures.processes import ASSIGNED, RoleProcesses
from tests.fixtures.workers import ledger_all_terminal

HOLDS = 60
FIRST_DUE_S, SPREAD_S = 20.0, 75.0  # the four minutes, shortened: the meaning is the same
SKEW_S = 300.0
EXIT_BOUND_S = 30.0

CHANGES = """
CREATE TABLE reservation_changes (id bigint NOT NULL, status text NOT NULL, at timestamptz NOT NULL);
CREATE FUNCTION record_reservation_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO reservation_changes VALUES (NEW.id, NEW.status, clock_timestamp());
  RETURN NEW;
END $$;
CREATE TRIGGER reservation_changed AFTER UPDATE ON reservations
  FOR EACH ROW EXECUTE FUNCTION record_reservation_change();
"""


@pytest.mark.slow
def test_skewed_workers_change_nothing_early_and_apply_due_work(pipeline, tmp_path):
    with pipeline.engine.begin() as conn:
        conn.exec_driver_sql(CHANGES)
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
        changes = conn.execute(text("SELECT id, status, at FROM reservation_changes")).all()
        states = dict(conn.execute(select(cleanup_ledger.c.state, func.count()).group_by(cleanup_ledger.c.state)).all())
        appliers = Counter(conn.execute(select(ledger_transitions.c.actor)
                                        .where(ledger_transitions.c.to_state == "applied")).scalars())
    early = [(rid, at - due[rid]) for rid, _, at in changes if at < due[rid]]
    assert early == [], f"business rows changed before their due time by the database's clock: {early}"
    assert Counter(rid for rid, _, _ in changes) == Counter(ids), "each due row changed exactly once"
    assert {status for _, status, _ in changes} == {"released"}
    assert states == {"applied": HOLDS}
    assert appliers["slow"] > 0, f"the slow worker applied nothing: {appliers}"
