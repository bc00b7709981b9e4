"""`lapse delay` on Apache Kafka: nothing leaves a tier early, a held partition holds only itself,
and no record waits in a tier longer than the tier's delay (a longer wait makes several trips)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer

from lapse.kernel.delays import HOPS_HEADER, TARGET_HEADER, due_header, parse_due
from lapse.processors.delay_worker import DelayWorker
from tests.fixtures.kafka import committed, read_topic
from tests.fixtures.pipeline import make_pipeline_settings
from tests.fixtures.polling import eventually
from tests.fixtures.topology import TOPICS_FILE


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


SLACK_S = 5  # "a few seconds": polling, a flush and a produce on a test broker


SHORT_TIER_S = 5  # the shortest tier's delay in the next test (30 s in the packaged topics.yaml)


def with_short_first_tier(folder: Path) -> Path:
    """The packaged topics file with its shortest tier waiting SHORT_TIER_S (renamed to say so)."""
    declared = yaml.safe_load(TOPICS_FILE.read_text())
    first = min((name for name, spec in declared["topics"].items() if "delay_seconds" in spec),
                key=lambda name: declared["topics"][name]["delay_seconds"])
    declared["topics"][f"lapse.delay.{SHORT_TIER_S}s"] = {**declared["topics"].pop(first),
                                                          "delay_seconds": SHORT_TIER_S}
    path = folder / "topics.yaml"
    path.write_text(yaml.safe_dump(declared))
    return path


@pytest.mark.slow
def test_a_long_wait_ahead_in_a_tier_partition_does_not_hold_a_short_one_behind_it(kafka_bootstrap, pg_url,
                                                                                   unique, tmp_path):
    """A 7-day wait and a 2 s wait in the same partition of the shortest tier, the 7-day one first:
    the 2 s one reaches the expiry topic within the tier's delay (plus a few seconds), and the
    7-day one leaves the tier after that delay, on its next trip to the longest tier with one hop
    counted; neither waited in the tier longer than its delay."""
    s = make_pipeline_settings(kafka_bootstrap, pg_url, unique, topics={"file": with_short_first_tier(tmp_path)})
    assert s.topology.tiers[0].delay_s == SHORT_TIER_S
    tier, longest = s.topology.tiers[0], s.topology.tiers[-1]
    now = datetime.now(UTC)
    target = [(TARGET_HEADER, s.topology.expiry.encode())]
    plan = [(b"week", now + timedelta(days=7)), (b"two-seconds", now + timedelta(seconds=2))]
    produced: dict[bytes, int] = {}  # key → its record's timestamp on the tier (ms)

    def delivered(err, msg) -> None:
        assert err is None, err
        produced[msg.key()] = msg.timestamp()[1]

    producer = Producer({"bootstrap.servers": s.kafka.bootstrap_servers, "enable.idempotence": True})
    for key, due in plan:
        producer.produce(tier.topic, key=key, value=b"v-" + key, partition=0,
                         headers=[due_header(due), *target, ("trace", b"t-" + key)], on_delivery=delivered)
    assert producer.flush(10) == 0

    worker = DelayWorker(s)  # every tier
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        eventually(lambda: worker.forwarded >= 1 and worker.trips >= 1, timeout_s=tier.delay_s + 60,
                   interval_s=0.2, what="the 2 s wake-up forwarded and the 7-day one sent on its next trip")
    finally:
        worker.stop.set()
        thread.join(30)

    out = read_topic(s.kafka.bootstrap_servers, s.topology.expiry)
    assert [m.key() for m in out] == [b"two-seconds"]  # the 7-day one never reaches the processor
    forwarded = out[0]
    left_at = forwarded.timestamp()[1]
    assert left_at >= int(parse_due(forwarded.headers()).timestamp() * 1000)  # not before it is due
    assert left_at - produced[b"two-seconds"] <= (tier.delay_s + SLACK_S) * 1000, "held past its tier's delay"

    onward = [m for m in read_topic(s.kafka.bootstrap_servers, longest.topic) if m.key() == b"week"]
    assert len(onward) == 1
    trip = onward[0]
    headers = dict(trip.headers())
    assert headers[HOPS_HEADER] == b"1"
    assert parse_due(trip.headers()) == parse_due([due_header(plan[0][1])])  # its due time travels with it
    assert headers[TARGET_HEADER] == s.topology.expiry.encode() and headers["trace"] == b"t-week"
    assert trip.value() == b"v-week"
    waited_ms = trip.timestamp()[1] - produced[b"week"]
    assert tier.delay_s * 1000 <= waited_ms <= (tier.delay_s + SLACK_S) * 1000, waited_ms
    offsets = committed(s.kafka.bootstrap_servers, s.topology.groups.delay, tier.topic, 2)
    assert offsets[0] == 2  # both left the tier partition, committed after they were acknowledged


def test_a_held_partition_given_back_by_a_rebalance_is_released_when_due(pipeline):
    """librdkafka keeps a partition paused across a rebalance that gives it back: a worker holding
    both partitions' heads, through a second member joining and leaving the group (each an eager
    rebalance that revokes and reassigns), still forwards both records once due."""
    s = pipeline.settings
    tier = s.topology.tiers[0].topic
    due = datetime.now(UTC) + timedelta(seconds=6)
    producer = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
    for part in (0, 1):
        producer.produce(tier, key=f"held-{part}".encode(), value=b"v", partition=part,
                         headers=[due_header(due), (TARGET_HEADER, s.topology.expiry.encode())])
    assert producer.flush(10) == 0

    worker = DelayWorker(s, topics=[tier])
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        eventually(lambda: len(worker.held) == 2, timeout_s=30, interval_s=0.1, what="both heads held")
        other = Consumer({"bootstrap.servers": s.kafka.bootstrap_servers, "group.id": s.topology.groups.delay,
                          "enable.auto.commit": False, "auto.offset.reset": "latest"})
        other.subscribe([tier])
        eventually(lambda: (other.poll(0.2), other.assignment())[1], timeout_s=30, what="a second member assigned")
        other.close()  # it leaves: the worker is given every partition again
        eventually(lambda: worker.forwarded == 2, timeout_s=30, interval_s=0.2, what="both records forwarded")
    finally:
        worker.stop.set()
        thread.join(30)
    assert sorted(m.key() for m in read_topic(s.kafka.bootstrap_servers, s.topology.expiry)) == [b"held-0", b"held-1"]
