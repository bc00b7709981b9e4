"""Several outbox relays in parallel on PostgreSQL (leased hash slots): every row is published, the
records of each key are on the topic in outbox-id order, and the slots of a relay that stops or
dies are taken over by another that finishes the work."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, insert, select

from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.ledger import LedgerWrites
from lapse.kernel.models import outbox
from lapse.producers.relay import run_relay
from lapse.producers.relay_queries import SLOTS
from lapse.producers.relay_slots import slot_holders as holders_of
from tests.fixtures.kafka import read_topic
from tests.fixtures.pipeline import Pipeline, expiry_event
from tests.fixtures.polling import eventually
from tests.fixtures.processes import RoleProcesses

KEYS, ROWS_PER_KEY = 400, 8


def fill_outbox(p: Pipeline, keys: int = KEYS, per_key: int = ROWS_PER_KEY, first: int = 0) -> int:
    """`per_key` outcomes for each of `keys` op keys, interleaved (key after key, round after
    round), so each key's rows are spread over the id order; returns the rows written."""
    writes = LedgerWrites("test", datetime.now(UTC), p.settings.topology.outcomes)
    for attempt in range(1, per_key + 1):
        for k in range(first, first + keys):
            writes.outcome(expiry_event(k), "retry_scheduled", attempt)
    with p.engine.begin() as conn:
        conn.execute(insert(outbox), writes.outbox)
    return len(writes.outbox)


def unsent(p: Pipeline) -> int:
    with p.engine.connect() as conn:
        return conn.execute(select(func.count()).where(outbox.c.sent_at.is_(None))).scalar_one()


def slot_holders(p: Pipeline) -> dict[int, int]:
    """Backend pid -> slots it holds."""
    return holders_of(p.engine)


def assert_published_in_key_order(p: Pipeline, rows: int, exactly_once: bool) -> None:
    """Every outbox id on the topic; per key, the ids in outbox-id order (a repeat after a crash,
    the same id again, is dropped as readers drop it: by `outcome_id`)."""
    with p.engine.connect() as conn:
        ids = set(conn.execute(select(outbox.c.id)).scalars())
    assert len(ids) == rows
    records = read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.outcomes)
    seen: list[int] = []
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for msg in records:
        oid = p.codec.decode_expected("cleanup_outcome", msg.value())["outcome_id"]
        seen.append(oid)
        if oid not in per_key[msg.key()]:
            per_key[msg.key()].append(oid)
    assert set(seen) == ids
    if exactly_once:
        assert len(seen) == rows
    assert all(seq == sorted(seq) for seq in per_key.values())
    assert {len(seq) for seq in per_key.values()} == {ROWS_PER_KEY}


def start_relay(p: Pipeline, stop: threading.Event, totals: list[int], i: int) -> threading.Thread:
    def relay() -> None:
        totals[i] = run_relay(p.engine, make_producer(p.settings), p.codec, limit=100, idle_s=0.05,
                              stop=stop, rebalance_s=0.2)
    thread = threading.Thread(target=relay, name=f"relay-{i}")
    thread.start()
    return thread


def test_three_relays_share_the_slots_keep_each_keys_order_and_take_over_a_stopped_one(pipeline):
    rows = fill_outbox(pipeline)
    stops = [threading.Event() for _ in range(3)]
    totals = [0, 0, 0]
    threads = [start_relay(pipeline, stops[i], totals, i) for i in range(3)]
    try:
        eventually(lambda: len(slot_holders(pipeline)) == 3 and unsent(pipeline) < rows * 2 // 3,
                   timeout_s=30, interval_s=0.05, what="three relays holding slots, a third of the rows sent")
        stops[0].set()  # the first relay stops after its batch in flight and gives its slots back
        threads[0].join(30)
        eventually(lambda: unsent(pipeline) == 0, timeout_s=60, what="every outbox row sent")
        holders = slot_holders(pipeline)
        assert len(holders) == 2 and sum(holders.values()) == SLOTS  # the stopped relay's slots taken over
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(30)
    assert sum(totals) == rows and all(totals)  # each relay published a share, no row twice
    assert_published_in_key_order(pipeline, rows, exactly_once=True)


@pytest.mark.slow
def test_a_killed_relays_slots_are_taken_over_and_its_work_finished(pipeline, tmp_path):
    procs = RoleProcesses(pipeline.settings, tmp_path)
    stop, totals = threading.Event(), [0]
    thread = None
    try:
        victim = procs.start("relay")
        eventually(lambda: sum(slot_holders(pipeline).values()) == SLOTS, timeout_s=30,
                   what="the relay process holding every slot")
        thread = start_relay(pipeline, stop, totals, 0)
        # the process gives back half once it counts two relays (every 2 s); the thread takes them
        eventually(lambda: sorted(slot_holders(pipeline).values()) == [SLOTS // 2, SLOTS // 2], timeout_s=30,
                   what="the slots split between the process and the thread")
        victim.kill()  # SIGKILL: its session ends with its locks, some slots still its own
        rows = fill_outbox(pipeline)
        eventually(lambda: unsent(pipeline) == 0, timeout_s=60, what="every outbox row sent by the survivor")
        assert list(slot_holders(pipeline).values()) == [SLOTS]
    finally:
        stop.set()
        if thread is not None:
            thread.join(30)
        procs.close()
    assert totals[0] == rows
    assert_published_in_key_order(pipeline, rows, exactly_once=True)
