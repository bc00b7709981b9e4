"""The commit order's two protections of the offsets (docs/design/processing.md, "The commit
order"), each with a batch that would commit wrongly without it, on Apache Kafka and PostgreSQL:

- a record of the batch that a delay tier or the DLQ does not acknowledge keeps every offset of the
  batch where it was (step 2 raises before step 3);
- a partition that a rebalance takes away while the batch is in the database gets no offset
  committed by this batch (step 3 commits owned partitions only), while the partition kept does.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import OFFSET_INVALID, TopicPartition

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import DeliveryFailed, DeliveryTracker, make_admin, make_consumer, make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import expiry_event
from lapse.processors import WorkerContext, commit_batch
from lapse.processors.decode import decode_batch
from tests.fixtures.kafka import create_topics
from tests.fixtures.pipeline import PARTITIONS, Pipeline, make_pipeline_settings, produce, seed
from tests.fixtures.polling import eventually

RELEASE = "release-reservation"
# How long the producer keeps trying a record a topic does not take: the refusal comes this fast.
REFUSED_AFTER_MS = 1500


def _pipeline(kafka_bootstrap, pg_url, unique, **kw) -> Pipeline:
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **kw)
    return Pipeline(settings, make_engine(pg_url), Codec.from_settings(settings))


def _consumed(consumer, topic: str, n: int) -> list:
    """The next `n` records of `topic` (subscribed by `consumer`), polled until they are there."""
    got: list = []

    def read() -> bool:
        got.extend(m for m in consumer.consume(n - len(got), 0.2) if m.error() is None)
        return len(got) >= n

    eventually(read, timeout_s=30, interval_s=0, what=f"{n} records of {topic}")
    return got


def _committed(consumer, topic: str, partitions: list[int]) -> dict[int, int]:
    return {tp.partition: tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in partitions],
                                                                 timeout=10)}


def _context(p: Pipeline, kinds=None) -> WorkerContext:
    return WorkerContext(settings=p.settings, engine=p.engine, codec=p.codec,
                         kinds=kinds or load_kinds(p.settings, p.engine),
                         producer=make_producer(p.settings, **{"message.timeout.ms": REFUSED_AFTER_MS}),
                         delivery=DeliveryTracker())


@pytest.mark.parametrize("refused", ["delay tier", "dlq"])
def test_a_record_not_acknowledged_keeps_the_batch_offsets(kafka_bootstrap, pg_url, unique, refused):
    """A batch whose wake-up (an event not due yet) or dead letter (a record that is not Avro)
    cannot be produced: its database work is done, commit_batch raises, and no offset of the batch
    moves; the same records once the topic takes them move the offsets to the end."""
    p = _pipeline(kafka_bootstrap, pg_url, unique, expiry_partitions=1, with_delay_tiers=refused != "delay tier")
    topology = p.settings.topology
    if refused == "dlq":
        admin = make_admin(p.settings)  # kept until the deletion is done: a dropped client cancels it
        admin.delete_topics([topology.dlq])[topology.dlq].result(30)
    seed(p, 1)
    produce(p, [expiry_event(RELEASE, 1, "t1", datetime.now(UTC) - timedelta(minutes=10), source="sweep")])
    odd = expiry_event(RELEASE, 2, "t1", datetime.now(UTC) + timedelta(hours=1), source="publish")
    if refused == "delay tier":
        produce(p, [odd])  # not due: handed back through a delay tier
    else:
        poison = make_producer(p.settings)
        poison.produce(topology.expiry, key=b"x", value=b"not avro")
        assert poison.flush(30) == 0
    consumer = make_consumer(p.settings, topology.groups.cleanup)
    consumer.subscribe([topology.expiry])
    try:
        messages = _consumed(consumer, topology.expiry, 2)
        ctx = _context(p)
        decoded = decode_batch(messages, ctx.codec, ctx.kinds)
        owned = {(topology.expiry, 0)}
        with pytest.raises(DeliveryFailed):
            commit_batch(ctx, consumer, owned, messages, *decoded)
        assert _committed(consumer, topology.expiry, [0]) == {0: OFFSET_INVALID}

        # The topic back: the same batch (redelivered after the failure) commits its offsets.
        create_topics(kafka_bootstrap, {t: PARTITIONS["delay"] for t in topology.delay_topics}
                      if refused == "delay tier" else {topology.dlq: PARTITIONS["dlq"]})
        commit_batch(replace(ctx, producer=make_producer(p.settings)), consumer, owned, messages, *decoded)
        assert _committed(consumer, topology.expiry, [0]) == {0: 2}
    finally:
        consumer.close()
        p.engine.dispose()


@pytest.mark.slow
def test_a_partition_revoked_during_the_batch_gets_no_offset(kafka_bootstrap, pg_url, unique):
    """Records of two partitions in one batch; while the batch is in the database a second member
    joins the group (the worker's thread serves the rebalance meanwhile, as it does while a batch
    is in flight), and the first member keeps one partition: only that one's offset is committed."""
    p = _pipeline(kafka_bootstrap, pg_url, unique, expiry_partitions=2)
    topology = p.settings.topology
    seed(p, 20)
    produce(p, [expiry_event(RELEASE, i, "t1", datetime.now(UTC) - timedelta(minutes=10), source="sweep")
                for i in range(1, 21)])
    owned: set[tuple[str, int]] = set()
    consumer = make_consumer(p.settings, topology.groups.cleanup)
    rebalanced: list[set[tuple[str, int]]] = []
    consumer.subscribe([topology.expiry],
                       on_assign=lambda c, parts: owned.update((t.topic, t.partition) for t in parts),
                       on_revoke=lambda c, parts: owned.difference_update((t.topic, t.partition) for t in parts))
    newcomer = make_consumer(p.settings, topology.groups.cleanup)
    try:
        messages = _consumed(consumer, topology.expiry, 20)
        assert {m.partition() for m in messages} == {0, 1}
        ctx = _context(p)
        release = ctx.kinds[RELEASE]

        def rebalance_then_release(conn, ids, now):
            """The effect, once a second member has joined and this one gave up a partition."""
            if not rebalanced:
                newcomer.subscribe([topology.expiry])

                def settled() -> bool:
                    newcomer.poll(0.1)
                    consumer.poll(0.1)  # serves this member's rebalance callbacks
                    return len(owned) == 1 and bool(newcomer.assignment())

                eventually(settled, timeout_s=60, interval_s=0, what="the partitions split between two members")
                rebalanced.append(set(owned))
            assert release.apply_in_db is not None
            return release.apply_in_db(conn, ids, now)

        ctx = replace(ctx, kinds={**ctx.kinds, RELEASE: replace(release, apply_in_db=rebalance_then_release)})
        decoded = decode_batch(messages, ctx.codec, ctx.kinds)
        commit_batch(ctx, consumer, owned, messages, *decoded)
        (kept,) = rebalanced[0]
        last = {m.partition(): m.offset() for m in sorted(messages, key=lambda m: m.offset())}
        committed = _committed(consumer, topology.expiry, [0, 1])
        assert committed[kept[1]] == last[kept[1]] + 1
        assert committed[1 - kept[1]] == OFFSET_INVALID
    finally:
        newcomer.close()
        consumer.close()
        p.engine.dispose()
