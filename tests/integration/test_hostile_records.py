"""Hostile records on Apache Kafka and PostgreSQL: whatever is produced into the expiry topic,
no worker exits, every partition's committed offset reaches its end, every hostile record is on
the DLQ with a reason, and the valid records around them are applied exactly once. And the last
resort: an event whose dead letter the ledger refuses goes to the DLQ as its raw record; a dead
letter the DLQ refuses for its size goes again without the original bytes."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_consumer
from lapse.kernel.ledger import OriginalBudget, expiry_record
from lapse.kernel.models import cleanup_ledger
from lapse.processors import CleanupWorker, commit_batch
from lapse.processors.decode import position_of
from tests.fixtures.hostile import (
    Hostile,
    assert_dead_lettered,
    dead_letters_by_position,
    header_lists,
    hostile_expiry_records,
    produce_all,
)
from tests.fixtures.kafka import admin, committed
from tests.fixtures.pipeline import (
    EXPIRY_PARTITIONS,
    Pipeline,
    assert_each_applied_once,
    expiry_event,
    make_pipeline_settings,
    seed,
)
from tests.fixtures.polling import eventually
from tests.fixtures.workers import RunningWorkers, running_workers, work_done

# The dead-letter circuit would pause a partition flooded with hostile records (by design); here
# every record must be seen, so it never trips.
NO_CIRCUIT = {"circuit_min_events": 1_000_000}


@dataclass
class Fuzzed:
    """Two workers running for the whole test on one pipeline, and the valid records so far."""

    pipeline: Pipeline
    running: RunningWorkers
    valid: int = 0
    # The time every example's strategies start from: fixed, so that Hypothesis can replay a draw.
    started: datetime = field(default_factory=lambda: datetime.now(UTC))


@pytest.fixture
def fuzzed(kafka_bootstrap, pg_url, unique) -> Iterator[Fuzzed]:
    settings_ = make_pipeline_settings(kafka_bootstrap, pg_url, unique, processor=NO_CIRCUIT)
    engine = make_engine(pg_url)
    try:
        with running_workers(settings_, 2) as running:
            yield Fuzzed(Pipeline(settings_, engine, Codec.from_settings(settings_)), running)
    finally:
        engine.dispose()


@pytest.mark.slow
@settings(max_examples=10, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(data=st.data())
def test_hostile_records_are_dead_lettered_while_two_workers_apply_the_valid_ones_once(fuzzed, data):
    p, running = fuzzed.pipeline, fuzzed.running
    s = p.settings
    now = fuzzed.started
    hostile = data.draw(st.lists(hostile_expiry_records(p.codec, now, EXPIRY_PARTITIONS), min_size=1, max_size=5),
                        label="hostile")
    for rec in hostile:
        event(f"hostile: {rec.what}")
    valid = []
    for rid in seed(p, data.draw(st.integers(1, 4), label="valid")):
        work = expiry_event(rid)
        headers = data.draw(header_lists(), label="valid headers") if data.draw(st.booleans()) else []
        valid.append(Hostile(p.codec.encode("expiry_event", expiry_record(work, now)), work.op_key.encode(),
                             headers, rid % EXPIRY_PARTITIONS))
    order = data.draw(st.permutations(hostile + valid), label="order")
    positions = produce_all(s.kafka.bootstrap_servers, s.topology.expiry, order)
    fuzzed.valid += len(valid)

    eventually(lambda: work_done(s, running, p.engine, EXPIRY_PARTITIONS, terminal=fuzzed.valid),
               timeout_s=90, what="offsets at the end and every valid record applied")

    running.check()
    assert all(thread.is_alive() for thread in running.threads), "a worker exited"
    letters = dead_letters_by_position(s, p.codec)
    assert_dead_lettered(letters, {pos: rec.names for rec, pos in zip(order, positions, strict=True)
                                   if rec in hostile})
    assert not [pos for rec, pos in zip(order, positions, strict=True) if rec in valid and pos in letters]
    assert_each_applied_once(p, fuzzed.valid)


def test_an_event_whose_dead_letter_the_ledger_refuses_goes_to_the_dlq_as_its_raw_record(pipeline):
    """The issue's crash, reproduced past a decoder that let a NUL and an attempt of 2**31-1
    through: PostgreSQL refuses the event's row and its dead letter; the raw record (of nearly
    the broker's maximum size) goes to the DLQ clipped, with its length and SHA-256, the good
    event is applied, and the partition's offset moves past all three."""
    s, codec = pipeline.settings, pipeline.codec
    rid, other, third = seed(pipeline, 3)
    now = datetime.now(UTC)
    good = expiry_event(rid)
    nul = expiry_event(other)._replace(correlation_id="c\x00")  # (a tenant that is not the row's is poison first)
    overflow = expiry_event(third)._replace(attempt=2**31 - 1)
    big = random.Random(7).randbytes(1_040_000)
    records = [Hostile(codec.encode("expiry_event", expiry_record(good, now)), good.op_key.encode()),
               Hostile(big, nul.op_key.encode()),
               Hostile(b"raw-" + overflow.op_key.encode(), overflow.op_key.encode())]
    where = produce_all(s.kafka.bootstrap_servers, s.topology.expiry, records)

    worker = CleanupWorker(s)
    consumer = make_consumer(s, s.topology.groups.cleanup)
    try:
        consumer.assign([TopicPartition(s.topology.expiry, 0, 0)])
        messages: list = []
        eventually(lambda: messages.extend(m for m in consumer.consume(3, 1.0) if m.error() is None)
                   or len(messages) == 3, interval_s=0, what="the three records consumed")
        positions = {m.key().decode(): position_of(m) for m in messages}
        result = commit_batch(worker.ctx, consumer, {(s.topology.expiry, 0)}, messages, [good, nul, overflow],
                              positions, [])
    finally:
        consumer.close()
        worker.close()

    assert result.applied == [good.op_key]
    letters = dead_letters_by_position(s, codec)
    budget = OriginalBudget.under(1_000_000)
    for position, original in ((where[1], big), (where[2], b"raw-" + overflow.op_key.encode())):
        msg, letter = letters[position]
        headers = dict(msg.headers())
        assert letter["failure_class"] == "poison" and letter["reason"].startswith("ledger_refused: ")
        assert letter["original_value"] == original[:budget.value]
        assert headers["lapse-original-value-bytes"] == str(len(original)).encode()
        assert headers["lapse-original-value-sha256"] == hashlib.sha256(original).hexdigest().encode()
    for position, refused in ((where[1], nul), (where[2], overflow)):  # the reason names it and both errors
        reason = letters[position][1]["reason"]
        assert refused.op_key in reason and "its dead letter failed too: " in reason
    assert "out of range" in letters[where[2]][1]["reason"]
    with pipeline.engine.connect() as conn:
        rows = dict(conn.execute(select(cleanup_ledger.c.op_key, cleanup_ledger.c.state)).all())
    assert rows == {good.op_key: "applied"}
    assert committed(s.kafka.bootstrap_servers, s.topology.groups.cleanup, s.topology.expiry, 1)[0] == 3


def test_a_dead_letter_the_dlq_refuses_for_its_size_goes_again_without_the_original_bytes(
        kafka_bootstrap, pg_url, unique):
    """MSG_SIZE_TOO_LARGE is no outage: a DLQ whose records may be 20,000 bytes refuses the
    clipped dead letter of a large poison record, which then goes without the original bytes
    (its length and hash still in the headers), and the partition moves on."""
    s = make_pipeline_settings(kafka_bootstrap, pg_url, unique)
    resource = ConfigResource(ConfigResource.Type.TOPIC, s.topology.dlq, incremental_configs=[
        ConfigEntry("max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET)])
    client = admin(kafka_bootstrap)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(30)
    p = Pipeline(s, make_engine(pg_url), Codec.from_settings(s))
    (rid,) = seed(p, 1)
    good = expiry_event(rid)
    value = random.Random(3).randbytes(300_000)
    produce_all(s.kafka.bootstrap_servers, s.topology.expiry, [
        Hostile(value, b"k", partition=0),
        Hostile(p.codec.encode("expiry_event", expiry_record(good, datetime.now(UTC))), good.op_key.encode())])

    with running_workers(s, 1) as running:
        eventually(lambda: work_done(s, running, p.engine, EXPIRY_PARTITIONS, terminal=1), timeout_s=90,
                   what="offsets at the end and the good record applied")
        running.check()

    msg, letter = dead_letters_by_position(s, p.codec)[(s.topology.expiry, 0, 0)]
    headers = dict(msg.headers())
    assert letter["original_value"] is None and "original bytes left out" in letter["reason"]
    assert headers["lapse-original-value-bytes"] == b"300000"
    assert headers["lapse-original-value-sha256"] == hashlib.sha256(value).hexdigest().encode()
    assert_each_applied_once(p, 1)
    p.engine.dispose()
