"""Issue 2 end to end on Apache Kafka and PostgreSQL: sweep → lapse.expiry → processor → outbox → outcomes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from lapse.devtools.demo_tables import reservations
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.producers.relay import relay_until_empty
from lapse.producers.sweep import sweep_once
from tests.fixtures.kafka import committed, read_topic
from tests.fixtures.pipeline import EXPIRY_PARTITIONS, all_committed, connection_env, expiry_event, produce, seed
from tests.fixtures.workers import process_until_done, process_with_workers


def outcomes(p) -> list[dict]:
    relay_until_empty(p.engine, make_producer(p.settings), p.codec, 500)
    return [p.codec.decode_expected("cleanup_outcome", m.value())
            for m in read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.outcomes)]


def ledger_row(p, rid):
    with p.engine.connect() as conn:
        return conn.execute(select(cleanup_ledger).where(
            cleanup_ledger.c.op_key == f"release-reservation:{rid}")).mappings().one()


def test_duplicate_delivery_applies_once_and_absorbs_the_rest(pipeline):
    (rid,) = seed(pipeline, 1)
    produce(pipeline, [expiry_event(rid)] * 3)
    stats = process_until_done(pipeline.settings)
    assert (stats.applied, stats.duplicates) == (1, 2)
    row = ledger_row(pipeline, rid)
    assert (row["state"], row["duplicates"]) == ("applied", 2)
    published = outcomes(pipeline)
    assert [(o["op_key"], o["status"]) for o in published] == [(f"release-reservation:{rid}", "applied")]
    assert all_committed(pipeline)


@pytest.mark.slow
def test_crash_after_db_commit_before_offset_commit(pipeline):
    """The worker dies between the DB commit and the offset commit; the next one skips the effect."""
    (rid,) = seed(pipeline, 1)
    produce(pipeline, [expiry_event(rid)])
    env = {**os.environ, **connection_env(pipeline.settings), "LAPSE_PROCESSOR__SESSION_TIMEOUT_MS": "6000",
           "LAPSE_DEV__CRASH_POINT": "after_db_commit"}
    crashed = subprocess.run([sys.executable, "-m", "lapse", "process", "--exit-when-idle", "20"],
                             env=env, capture_output=True, timeout=120)
    assert crashed.returncode == 17, crashed.stderr.decode()[-2000:]
    first = ledger_row(pipeline, rid)
    assert first["state"] == "applied"
    with pipeline.engine.connect() as conn:
        released_at = conn.execute(select(reservations.c.released_at)).scalar()
    s = pipeline.settings
    assert set(committed(s.kafka.bootstrap_servers, s.topology.groups.cleanup, s.topology.expiry,
                         EXPIRY_PARTITIONS).values()) == {-1001}

    stats = process_until_done(pipeline.settings)
    assert (stats.applied, stats.duplicates) == (0, 1)
    with pipeline.engine.connect() as conn:
        assert conn.execute(select(reservations.c.released_at)).scalar() == released_at
        assert conn.execute(select(func.count()).select_from(ledger_transitions)).scalar() == 1
    assert ledger_row(pipeline, rid)["duplicates"] == 1
    assert all_committed(pipeline)


def test_payment_after_the_event_was_produced_wins(pipeline):
    (rid,) = seed(pipeline, 1)
    produce(pipeline, [expiry_event(rid)])
    with pipeline.engine.begin() as conn:
        conn.execute(update(reservations).where(reservations.c.id == rid).values(status="paid"))
    process_until_done(pipeline.settings)
    assert ledger_row(pipeline, rid)["state"] == "skipped"
    with pipeline.engine.connect() as conn:
        assert conn.execute(select(reservations.c.status)).scalar() == "paid"
    assert [o["status"] for o in outcomes(pipeline)] == ["skipped"]


def test_two_workers_over_six_partitions_apply_every_event_once(pipeline):
    ids = seed(pipeline, 3000)
    produce(pipeline, [expiry_event(i) for i in ids])
    stats = process_with_workers(pipeline.settings, 2, timeout_s=180)
    assert sum(s.applied for s in stats) == 3000
    with pipeline.engine.connect() as conn:
        per_key = Counter(conn.execute(select(ledger_transitions.c.op_key)).scalars())
        released = conn.execute(select(func.count()).where(reservations.c.status == "released")).scalar()
    assert released == 3000
    assert len(per_key) == 3000 and set(per_key.values()) == {1}
    assert all_committed(pipeline)


@pytest.mark.slow
def test_sweep_pages_through_due_rows_and_emits_each_once(pipeline):
    seed(pipeline, 10_000)
    seed(pipeline, 50, expires_at=datetime.now(UTC) + timedelta(hours=1))  # not due
    settings = pipeline.settings.with_(producer={"sweep_page_size": 500})
    producer = make_producer(settings)
    kinds = load_kinds(settings, pipeline.engine)
    first = sweep_once(pipeline.engine, producer, pipeline.codec, settings, kinds)
    second = sweep_once(pipeline.engine, producer, pipeline.codec, settings, kinds)
    assert (first.pages, first.emitted) == (20, 10_000)
    assert second.emitted == 0
    keys = [m.key() for m in read_topic(settings.kafka.bootstrap_servers, settings.topology.expiry)]
    assert len(keys) == len(set(keys)) == 10_000
    with pipeline.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cleanup_ledger)).scalar() == 10_000


def test_undecodable_bytes_are_dead_lettered_and_the_partition_moves_on(pipeline):
    (rid,) = seed(pipeline, 1)
    event = expiry_event(rid)
    producer = make_producer(pipeline.settings)
    producer.produce(pipeline.settings.topology.expiry, key=event.op_key.encode(), value=b"\x00garbage")
    producer.flush(10)
    produce(pipeline, [event])  # same key, same partition, after the poison record
    stats = process_until_done(pipeline.settings)
    assert (stats.poison, stats.applied) == (1, 1)
    dead = read_topic(pipeline.settings.kafka.bootstrap_servers, pipeline.settings.topology.dlq)
    assert len(dead) == 1
    letter = pipeline.codec.decode_expected("dead_letter", dead[0].value())
    assert letter["failure_class"] == "poison"
    assert letter["reason"].startswith(("malformed_body", "registry_unavailable", "bad_magic"))
    assert letter["original_value"] == b"\x00garbage"
    assert dict(dead[0].headers())["failure_class"] == b"poison"
    assert all_committed(pipeline)


def test_two_relays_at_once_publish_each_outbox_row_once_in_order(pipeline):
    ids = seed(pipeline, 600)
    produce(pipeline, [expiry_event(i) for i in ids])
    process_until_done(pipeline.settings)
    relayed = []

    def relay():
        relayed.append(relay_until_empty(pipeline.engine, make_producer(pipeline.settings),
                                         pipeline.codec, 50))

    threads = [threading.Thread(target=relay) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert sum(relayed) == 600
    records = read_topic(pipeline.settings.kafka.bootstrap_servers, pipeline.settings.topology.outcomes)
    ids_seen = [pipeline.codec.decode_expected("cleanup_outcome", m.value())["outcome_id"] for m in records]
    assert sorted(ids_seen) == sorted(set(ids_seen)) and len(ids_seen) == 600
    by_partition: dict[int, list[int]] = {}
    for msg, oid in zip(records, ids_seen, strict=True):
        by_partition.setdefault(msg.partition(), []).append(oid)
    assert all(seq == sorted(seq) for seq in by_partition.values())  # outbox order kept
