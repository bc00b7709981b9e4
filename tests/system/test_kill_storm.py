"""The kill storm (`make storm`; marked `storm`, so `make test` leaves it out): cleanup workers and
outbox relays run as real `lapse process` / `lapse relay` processes while 20,000 expiry events
arrive; every 1 to 3 s one of them, picked at random, is SIGKILLed and started again, for 60 s. Once
the pipeline has drained: nothing lost (every op key applied, every business row released, every
offset committed, the outbox sent), nothing done twice (one applied transition per op key), and
one outcome per op key, counting distinct outcome ids (the relay publishes at least once). The
processors' wall clocks take turns at normal, 300 s fast and 300 s slow (only Python's, with
time-machine): the database's clock decides leases and due times, so the skew changes nothing.

The failover storm: the same processes while the database fails over twice (read-only for 15 s
with every session terminated, then writable with every session terminated again): no process
exits, and the same checks hold, with no dead letter."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import defaultdict

import pytest
from sqlalchemy import func, select

from lapse.devtools.demo_tables import reservations
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from tests.fixtures.faults import read_only_failover
from tests.fixtures.kafka import read_topic
from tests.fixtures.pipeline import all_committed, assert_each_applied_once, expiry_event, produce, seed
from tests.fixtures.polling import eventually
from tests.fixtures.processes import ASSIGNED, RoleProcesses
from tests.fixtures.workers import ledger_all_terminal

EVENTS = 20_000
PROCESSORS, RELAYS = 3, 2
STORM_S = 60.0
KILL_EVERY_S = (1.0, 3.0)
CHUNKS = 40  # the events arrive in this many parts, one a second, during the storm
EXIT_BOUND_S = 30.0
SKEWS_S = (None, 300.0, -300.0)  # each processor started takes the next (docs/design/clock.md)
FAILOVER_EVENTS = 5_000
FAILOVERS, FAILOVER_S = 2, 15.0


def outbox_sent(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).where(outbox.c.sent_at.is_(None))).scalar() == 0


def produce_over(pipeline, ids: list[int]) -> threading.Thread:
    def run() -> None:
        size = -(-len(ids) // CHUNKS)
        for start in range(0, len(ids), size):
            produce(pipeline, [expiry_event(i) for i in ids[start:start + size]])
            time.sleep(1.0)
    thread = threading.Thread(target=run, name="storm-producer", daemon=True)
    thread.start()
    return thread


@pytest.mark.storm
@pytest.mark.slow
def test_kill_storm_loses_nothing_and_does_nothing_twice(pipeline, tmp_path):
    ids = seed(pipeline, EVENTS, tenant="t1")  # the tenant of expiry_event
    procs = RoleProcesses(pipeline.settings, tmp_path)
    rng = random.Random(2026_11_30)
    kills: dict[str, int] = defaultdict(int)
    skews = itertools.cycle(SKEWS_S)

    def start(command: str) -> None:
        procs.start(command, skew_s=next(skews) if command == "process" else None)

    started = time.monotonic()
    try:
        for _ in range(PROCESSORS):
            start("process")
        for _ in range(RELAYS):
            procs.start("relay")
        eventually(lambda: any(w.said(ASSIGNED) for w in procs.running("process")), timeout_s=60,
                   what="a cleanup worker with partitions")
        producer = produce_over(pipeline, ids)
        storm_started = time.monotonic()
        storm_ends = storm_started + STORM_S
        while time.monotonic() < storm_ends:
            time.sleep(rng.uniform(*KILL_EVERY_S))
            victim = rng.choice(procs.running())
            victim.kill()
            kills[victim.command] += 1
            start(victim.command)
        storm_s = time.monotonic() - storm_started
        producer.join(120)

        eventually(lambda: ledger_all_terminal(pipeline.engine, terminal=EVENTS) and all_committed(pipeline)
                   and outbox_sent(pipeline.engine), timeout_s=600, interval_s=2.0,
                   what=f"{EVENTS} terminal ledger rows, every offset committed, the outbox sent")
        drained_s = time.monotonic() - started
        last = procs.running()
        for role in last:
            role.terminate()
        for role in last:
            code = role.wait_exit(EXIT_BOUND_S)
            assert code == 0, f"{role.command}: not exit 0 within {EXIT_BOUND_S:g} s of SIGTERM: {code}\n{role.tail()}"
    finally:
        procs.close()

    # Nothing lost, nothing done twice.
    assert_each_applied_once(pipeline, EVENTS)  # one transition per op key, every offset committed
    with pipeline.engine.connect() as conn:
        states = dict(conn.execute(select(cleanup_ledger.c.state, func.count()).group_by(cleanup_ledger.c.state)).all())
        applied_per_key = set(conn.execute(
            select(func.count()).where(ledger_transitions.c.to_state == "applied")
            .group_by(ledger_transitions.c.op_key)).scalars())
        released = conn.execute(select(func.count()).where(
            reservations.c.id.in_(ids), reservations.c.status == "released")).scalar()
        absorbed = conn.execute(select(func.coalesce(func.sum(cleanup_ledger.c.duplicates), 0))).scalar()
    assert states == {"applied": EVENTS}
    assert applied_per_key == {1}
    assert released == EVENTS

    # One terminal outcome per op key: the relay may publish a row twice, with the same outcome id.
    bootstrap, topics = pipeline.settings.kafka.bootstrap_servers, pipeline.settings.topology
    outcome_ids: dict[str, set[int]] = defaultdict(set)
    records = read_topic(bootstrap, topics.outcomes, timeout=120)
    for msg in records:
        outcome = pipeline.codec.decode_expected("cleanup_outcome", msg.value())
        outcome_ids[outcome["op_key"]].add(outcome["outcome_id"])
    assert set(outcome_ids) == {expiry_event(i).op_key for i in ids}
    assert {len(v) for v in outcome_ids.values()} == {1}
    assert read_topic(bootstrap, topics.dlq) == []

    print(f"\nkill storm: {EVENTS} events, {sum(kills.values())} SIGKILLs ({kills['process']} processors, "
          f"{kills['relay']} relays) in {storm_s:.0f} s, drained after {drained_s:.0f} s; "
          f"{absorbed} duplicate deliveries absorbed by the ledger; {len(records)} outcome records, "
          f"{sum(len(v) for v in outcome_ids.values())} distinct outcome ids "
          f"({len(records) - sum(len(v) for v in outcome_ids.values())} republished)")


@pytest.mark.storm
@pytest.mark.slow
def test_failover_storm_exits_nothing_loses_nothing_and_does_nothing_twice(pipeline, tmp_path):
    ids = seed(pipeline, FAILOVER_EVENTS, tenant="t1")
    procs = RoleProcesses(pipeline.settings, tmp_path)
    try:
        for _ in range(PROCESSORS):
            procs.start("process")
        for _ in range(RELAYS):
            procs.start("relay")
        eventually(lambda: any(w.said(ASSIGNED) for w in procs.running("process")), timeout_s=60,
                   what="a cleanup worker with partitions")
        producer = produce_over(pipeline, ids)
        with read_only_failover(pipeline.settings.database.url_plain()) as failover:
            for _ in range(FAILOVERS):
                time.sleep(5.0)  # writable: some of the backlog gets through
                failover.begin()
                time.sleep(FAILOVER_S)
                failover.end()
        producer.join(120)
        exited = [(p.command, p.proc.returncode, p.tail()) for p in procs.started if p.proc.poll() is not None]
        assert not exited, exited
        eventually(lambda: ledger_all_terminal(pipeline.engine, terminal=FAILOVER_EVENTS) and all_committed(pipeline)
                   and outbox_sent(pipeline.engine), timeout_s=300, interval_s=2.0,
                   what=f"{FAILOVER_EVENTS} terminal ledger rows, every offset committed, the outbox sent")
        assert len(procs.running()) == PROCESSORS + RELAYS  # none exited, none restarted
        read_only = sum(p.said("read-only transaction") for p in procs.started)
        for role in procs.started:
            role.terminate()
        for role in procs.started:
            code = role.wait_exit(EXIT_BOUND_S)
            assert code == 0, f"{role.command}: not exit 0 within {EXIT_BOUND_S:g} s of SIGTERM: {code}\n{role.tail()}"
    finally:
        procs.close()
    assert read_only > 0  # the roles did meet the read-only database
    assert_each_applied_once(pipeline, FAILOVER_EVENTS)
    with pipeline.engine.connect() as conn:
        states = dict(conn.execute(select(cleanup_ledger.c.state, func.count()).group_by(cleanup_ledger.c.state)).all())
        released = conn.execute(select(func.count()).where(
            reservations.c.id.in_(ids), reservations.c.status == "released")).scalar()
    assert states == {"applied": FAILOVER_EVENTS} and released == FAILOVER_EVENTS
    bootstrap, topics = pipeline.settings.kafka.bootstrap_servers, pipeline.settings.topology
    outcome_ids: dict[str, set[int]] = defaultdict(set)
    for msg in read_topic(bootstrap, topics.outcomes, timeout=120):
        outcome = pipeline.codec.decode_expected("cleanup_outcome", msg.value())
        outcome_ids[outcome["op_key"]].add(outcome["outcome_id"])
    assert set(outcome_ids) == {expiry_event(i).op_key for i in ids}
    assert {len(v) for v in outcome_ids.values()} == {1}
    assert read_topic(bootstrap, topics.dlq) == []
