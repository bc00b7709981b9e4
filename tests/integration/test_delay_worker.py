"""`lapse delay` on Apache Kafka: nothing leaves a tier early, and a held partition holds only itself."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer

from lapse.kernel.delays import TARGET_HEADER, due_header, parse_due
from lapse.processors.delay_worker import DelayWorker
from tests.fixtures.kafka import committed, read_topic
from tests.fixtures.polling import eventually


def test_delay_tier_forwards_when_due_and_a_held_partition_holds_only_itself(pipeline):
    s = pipeline.settings
    tier = s.topology.tiers[0].topic
    now = datetime.now(UTC)
    target = [(TARGET_HEADER, s.topology.expiry.encode())]
    producer = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
    plan = [  # (partition, key, due)
        (0, b"far", now + timedelta(hours=1)),       # head of partition 0: holds it
        (0, b"behind-far", now - timedelta(seconds=1)),  # due, but waits behind its head
        (1, b"soon", now + timedelta(seconds=2)),
        (1, b"already", now - timedelta(seconds=1)),
    ]
    for part, key, due in plan:
        producer.produce(tier, key=key, value=b"v-" + key, partition=part,
                         headers=[due_header(due), *target])
    assert producer.flush(10) == 0

    worker = DelayWorker(s, topics=[tier])
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        eventually(lambda: worker.forwarded >= 2, timeout_s=30, interval_s=0.1, what="the two due records forwarded")
    finally:
        worker.stop.set()
        thread.join(30)

    out = read_topic(s.kafka.bootstrap_servers, s.topology.expiry)
    assert sorted(m.key() for m in out) == [b"already", b"soon"]
    for msg in out:  # forwarded no earlier than its due time (producer CreateTime)
        assert msg.timestamp()[1] >= int(parse_due(msg.headers()).timestamp() * 1000)
        assert msg.value() == b"v-" + msg.key()
    offsets = committed(s.kafka.bootstrap_servers, s.topology.groups.delay, tier, 2)
    assert offsets[1] == 2 and offsets[0] < 0  # partition 0 committed nothing past its held head
