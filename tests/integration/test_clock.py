"""The database's clock (docs/design/clock.md) on PostgreSQL and SQLite; a worker whose wall clock
runs 300 s fast takes no live lease of a slow http effect (the server sees one call per op key,
never two at once); a Retry-After given as an HTTP-date waits as long as the far side asked,
whatever the worker's clock reads; and a process's skew is measured, warned about, a gauge and a `lapse status`
line. Python's wall clock of this test process is shifted with time-machine where it says so."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import time_machine
import yaml
from prometheus_client import REGISTRY
from sqlalchemy import select

from lapse.kernel.clock import database_now, engine_now, now_in
from lapse.kernel.clock_watch import ClockWatch
from lapse.kernel.database import make_engine
from lapse.kernel.findings import CLOCK, latest_findings
from lapse.kernel.kinds import compile_kinds, read_kinds_file
from lapse.kernel.ledger import expiry_event
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.settings import load_settings
from lapse.processors.effect_calls import build_caller
from lapse.processors.leased import EffectRunner, run_leased
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchResult, BatchScope
from lapse.readers import status_report
from tests.fixtures.effects import Answer, hook_kind, hooks_table
from tests.fixtures.pipeline import connection_env
from tests.fixtures.polling import eventually
from tests.fixtures.processes import run_lapse
from tests.fixtures.topology import repo_topology

SKEW = timedelta(seconds=300)
KIND = "notify-hook"
LEASE = timedelta(seconds=6)  # renewed every 2 s while the call runs
CALL_S = 4.0


def fast(by: timedelta = SKEW) -> time_machine.travel:
    """This process's wall clock `by` ahead, ticking (the database's clock stays where it is)."""
    return time_machine.travel(datetime.now(UTC) + by, tick=True)


def test_the_database_clock_on_postgresql_and_sqlite(engine, tmp_path):
    sqlite = make_engine(f"sqlite:///{tmp_path / 'lapse.db'}")
    try:
        for bind in (engine, sqlite):
            with fast(), bind.connect() as conn:
                theirs = database_now(conn)
                assert theirs.tzinfo is not None
                assert abs(datetime.now(UTC) - SKEW - theirs) < timedelta(seconds=5)
                assert now_in(conn, lambda: datetime(2030, 1, 1, tzinfo=UTC)).year == 2030
            assert abs(engine_now(bind) - datetime.now(UTC)) < timedelta(seconds=5)
    finally:
        sqlite.dispose()


def test_a_fast_worker_takes_no_live_lease_of_a_slow_call(engine, http_server, tmp_path):
    http_server.script("slow", Answer(200, delay_s=CALL_S))
    hooks = hooks_table("hooks")
    hooks.create(engine)
    with engine.begin() as conn:
        due = database_now(conn) - timedelta(minutes=1)
        conn.execute(hooks.insert(), [{"id": i, "tenant": "t1", "script": "slow", "status": "open", "due_at": due}
                                      for i in range(1, 4)])
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump({"kinds": {KIND: hook_kind(hooks, http_server.url)}}))
    kinds = compile_kinds(read_kinds_file(path), engine)
    events = [expiry_event(KIND, i, "t1", due, source="sweep", correlation_id=f"c{i}") for i in range(1, 4)]
    runner = EffectRunner(build_caller, concurrency=4)
    done: list[BatchResult] = []

    def deliver(worker: str) -> BatchResult:
        """One delivery as a worker without a set clock does it: claim, call under the lease, complete."""
        with engine.connect() as conn:
            scope = BatchScope(conn, kinds=kinds, topics=repo_topology(), worker=worker,
                               now=datetime.now(UTC), lease=LEASE)
            with conn.begin():
                claimed = apply_batch(scope.begun(), events)
            claimed.absorb(run_leased(runner, scope, claimed))
            return claimed

    first = threading.Thread(target=lambda: done.append(deliver("normal")), name="normal-worker")
    try:
        first.start()
        eventually(lambda: len(http_server.received) == 3, timeout_s=10, what="the three calls in flight")
        with fast():  # the second worker's clock is 300 s past every lease the first holds
            second = deliver("fast")
        first.join(30)
    finally:
        runner.close()
    keys = [e.op_key for e in events]
    assert second.leased == [] and sorted(second.conflicts) == sorted(keys)
    assert sorted(done[0].applied) == sorted(keys)
    assert http_server.overlaps == []
    assert [len(http_server.requests_for(k)) for k in keys] == [1, 1, 1]
    with engine.connect() as conn:
        assert set(conn.execute(select(cleanup_ledger.c.state)).scalars()) == {"applied"}


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["fast", "slow"])
@pytest.mark.parametrize("dated", [True, False], ids=["with-date", "without-date"])
def test_an_http_date_retry_after_waits_as_asked_on_a_skewed_worker(engine, http_server, tmp_path, skew, dated):
    """A 429 asking to come back at an HTTP-date 40 s after the far side's now: the retry is due
    40 s after it, measured from the answer's own `Date`, else by the database's clock; a worker
    300 s fast would retry at once by its own clock, one 300 s slow after 340 s."""
    hooks = hooks_table("hooks")
    hooks.create(engine)
    with engine.begin() as conn:
        sent = database_now(conn)
        conn.execute(hooks.insert(), {"id": 1, "tenant": "t1", "script": "limited", "status": "open",
                                      "due_at": sent - timedelta(minutes=1)})
    headers = {"Retry-After": format_datetime(sent + timedelta(seconds=40), usegmt=True)}
    if dated:
        headers["Date"] = format_datetime(sent, usegmt=True)
    http_server.script("limited", Answer(429, headers))
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump({"kinds": {KIND: hook_kind(hooks, http_server.url)}}))
    kinds = compile_kinds(read_kinds_file(path), engine)
    event = expiry_event(KIND, 1, "t1", sent - timedelta(minutes=1), source="sweep", correlation_id="c1")
    runner = EffectRunner(build_caller, concurrency=1)
    try:
        with fast(skew), engine.connect() as conn:  # the worker's clock only: the database's is real
            scope = BatchScope(conn, kinds=kinds, topics=repo_topology(), worker="skewed",
                               now=datetime.now(UTC), lease=LEASE)
            with conn.begin():
                claimed = apply_batch(scope.begun(), [event])
            claimed.absorb(run_leased(runner, scope, claimed))
    finally:
        runner.close()
    assert claimed.retried == [event.op_key]
    with engine.connect() as conn:
        row = conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == event.op_key)).mappings().one()
    assert (row["state"], row["attempt"], row["last_failure_class"]) == ("retry_scheduled", 0, "rate_limited")
    assert abs(row["due_at"] - (sent + timedelta(seconds=40))) < timedelta(seconds=3)


def test_a_skewed_clock_is_measured_warned_about_and_shown_by_status(pipeline, tmp_path, caplog):
    settings = load_settings(database={"url": pipeline.settings.database.url_plain()},
                             runtime={"worker_id": "w-fast", "clock_skew_bound_s": 5})
    watch = ClockWatch(settings, "delay", lambda: pipeline.engine)
    with fast(), caplog.at_level(logging.WARNING, logger="lapse.clock"):
        skews = [watch.measure(), watch.measure()]
        corrected = watch.now()
    assert all(s is not None and abs(s - SKEW.total_seconds()) < 2 for s in skews)
    assert abs(corrected - datetime.now(UTC)) < timedelta(seconds=2)  # the delay worker's clock
    assert len([r for r in caplog.records if "from the database's" in r.getMessage()]) == 1  # not every pass
    assert abs(REGISTRY.get_sample_value("lapse_clock_skew_seconds", {"role": "delay"}) - 300) < 2
    with pipeline.engine.connect() as conn:
        (found,) = [f for f in latest_findings(conn) if f.role == CLOCK]
    assert found.subject == "delay w-fast" and found.details["bound_s"] == 5

    (as_json, as_text) = run_lapse(["status", "--no-lag", "--json"], ["status", "--no-lag"],
                                   env=connection_env(pipeline.settings), cwd=tmp_path)
    assert as_json.code == 0 and as_text.code == 0, as_json.stderr + as_text.stderr
    (clock,) = json.loads(as_json.stdout)["findings"]["clocks"]
    assert clock["subject"] == "delay w-fast" and abs(clock["details"]["skew_s"] - 300) < 2
    assert "clock delay w-fast: +300" in as_text.stdout and "beyond the bound of 5s" in as_text.stdout

    with pipeline.engine.connect() as conn:  # a normal clock: within the bound, no warning line
        report = status_report(pipeline.settings, pipeline.engine, database_now(conn), lag=False)
    assert report["findings"]["clocks"][0]["details"]["skew_s"] > 5
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lapse.clock"):
        assert abs(watch.measure() or 0.0) < 2
    assert not [r for r in caplog.records if "from the database's" in r.getMessage()]
