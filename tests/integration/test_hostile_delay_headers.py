"""Hostile delay-tier headers on Apache Kafka: whatever `lapse-target` and `lapse-due-at` say, the
delay worker forwards only to the expiry topic, dead-letters what it cannot forward (with the
header at fault in the reason), stays alive, and commits every tier partition to its end."""

from __future__ import annotations

import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from lapse.kernel.codec import Codec
from lapse.kernel.delays import HOPS_HEADER, TARGET_HEADER, due_header, hop_limit
from lapse.kernel.settings import Settings
from lapse.processors import DelayWorker
from tests.fixtures.hostile import (
    ISSUE_FORMS,
    OVER_PRODUCER_MAX,
    WAKE_UP_FORMS,
    Hostile,
    assert_dead_lettered,
    caught_up,
    dead_letters_by_position,
    hostile_wake_up_headers,
    produce_all,
    valid_wake_up_headers,
)
from tests.fixtures.kafka import admin, read_topic
from tests.fixtures.pipeline import PARTITIONS, make_pipeline_settings
from tests.fixtures.polling import eventually


@dataclass
class Delaying:
    """One delay worker on every tier for the whole test, and what it was sent so far."""

    settings: Settings
    worker: DelayWorker
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)
    # The time every example's strategies start from: fixed, so that Hypothesis can replay a draw.
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    valid_keys: list[bytes] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        if self.errors:
            raise RuntimeError(f"the delay worker failed: {self.errors[0]!r}") from self.errors[0]
        return self.thread.is_alive()


@pytest.fixture
def delaying(kafka_bootstrap, pg_url, unique) -> Iterator[Delaying]:
    s = make_pipeline_settings(kafka_bootstrap, pg_url, unique)
    worker = DelayWorker(s)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)
            raise

    thread = threading.Thread(target=run, daemon=True, name="delay-worker")
    thread.start()
    try:
        yield Delaying(s, worker, thread, errors)
    finally:
        worker.stop.set()
        thread.join(60)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(data=st.data())
def test_hostile_delay_headers_are_dead_lettered_and_nothing_leaves_for_another_topic(delaying, data):
    s = delaying.settings
    topology = s.topology
    now = delaying.started
    fresh = f"{s.topics.prefix}elsewhere-{uuid.uuid4().hex[:8]}"  # a topic a forward would create
    delaying.elsewhere.append(fresh)
    elsewhere = [topology.outcomes, topology.dlq, fresh, topology.expiry + "x", topology.expiry.upper(),
                 topology.tiers[0].topic]

    def place() -> tuple[str, int]:
        return (data.draw(st.sampled_from(topology.delay_topics), label="tier"),
                data.draw(st.integers(0, PARTITIONS["delay"] - 1), label="partition"))

    records: list[tuple[str, Hostile]] = []
    forms = [*ISSUE_FORMS, *data.draw(st.lists(st.sampled_from(WAKE_UP_FORMS), max_size=4), label="forms")]
    for form in forms:
        headers, names, _ = data.draw(hostile_wake_up_headers(topology.expiry, elsewhere, now, form))
        event(f"hostile: {form}")
        tier, partition = place()
        records.append((tier, Hostile(data.draw(st.none() | st.binary(max_size=200)), b"bad-" + uuid.uuid4().bytes,
                                      headers, partition, names, form)))
    if data.draw(st.booleans(), label="one too large to forward"):
        event("hostile: too large to forward")
        tier, partition = place()
        size = data.draw(st.integers(*OVER_PRODUCER_MAX))
        records.append((tier, Hostile(random.Random(size).randbytes(size), b"bad-" + uuid.uuid4().bytes,
                                      data.draw(valid_wake_up_headers(topology.expiry, now)), partition,
                                      "forward_refused", "too large")))
    for _ in range(data.draw(st.integers(1, 4), label="valid")):
        tier, partition = place()
        key = b"ok-" + uuid.uuid4().bytes
        delaying.valid_keys.append(key)
        records.append((tier, Hostile(data.draw(st.none() | st.binary(max_size=200)), key,
                                      data.draw(valid_wake_up_headers(topology.expiry, now)), partition)))
    records = data.draw(st.permutations(records), label="order")

    positions = []
    for tier, record in records:
        positions += produce_all(s.kafka.bootstrap_servers, tier, [record])
    tiers = {tier: PARTITIONS["delay"] for tier in topology.delay_topics}
    eventually(lambda: delaying.alive() and caught_up(s, topology.groups.delay, tiers), timeout_s=90,
               what="every tier partition committed to its end")

    assert delaying.alive(), "the delay worker exited"
    codec = Codec.from_settings(s)
    letters = dead_letters_by_position(s, codec)
    assert_dead_lettered(letters, {pos: rec.names for (_, rec), pos in zip(records, positions, strict=True)
                                   if rec.key.startswith(b"bad-")})
    forwarded = Counter(m.key() for m in read_topic(s.kafka.bootstrap_servers, topology.expiry))
    assert forwarded == Counter(delaying.valid_keys)  # each valid one once, nothing hostile
    assert not read_topic(s.kafka.bootstrap_servers, topology.outcomes)
    assert all(letter["source_topic"] in tiers for _, letter in letters.values())
    existing = admin(s.kafka.bootstrap_servers).list_topics(timeout=20).topics
    assert not [name for name in delaying.elsewhere if name in existing]


def test_hostile_hop_counts_and_timestamps_neither_loop_nor_hold_a_tier(delaying):
    """`lapse-hops` is outside input too: a malformed or repeated count is dead-lettered naming it; a
    record at the hop limit that is not due is dead-lettered rather than sent on another trip, and
    one that is due is forwarded; a record timestamp from long ago releases a record at once, which
    then makes its next trip with one more hop. The tier partition is committed to its end."""
    s = delaying.settings
    topology = s.topology
    tier, longest = topology.tiers[0], topology.tiers[-1]
    now = datetime.now(UTC)
    limit = hop_limit(topology.tiers)
    past, week = due_header(now - timedelta(seconds=1)), due_header(now + timedelta(days=7))
    target = (TARGET_HEADER, topology.expiry.encode())
    long_ago = int((now - timedelta(days=1)).timestamp() * 1000)
    plan: list[tuple[bytes, list[tuple[str, bytes | None]], int | None, str | None]] = [
        # key, headers, record timestamp (ms; None: the producer's), the header a dead letter names
        (b"bad-garbage", [past, target, (HOPS_HEADER, b"-1")], None, HOPS_HEADER),
        (b"bad-long", [past, target, (HOPS_HEADER, b"1" * 10)], None, HOPS_HEADER),
        (b"bad-twice", [past, target, (HOPS_HEADER, b"1"), (HOPS_HEADER, b"2")], None, HOPS_HEADER),
        (b"bad-looping", [week, target, (HOPS_HEADER, str(limit).encode())], long_ago, HOPS_HEADER),
        (b"ok-due-at-limit", [past, target, (HOPS_HEADER, str(limit).encode())], None, None),
        (b"ok-old-timestamp", [week, target], long_ago, None),
    ]
    positions: dict[bytes, tuple[str, int, int]] = {}

    def delivered(err, msg) -> None:
        assert err is None, err
        positions[msg.key()] = (msg.topic(), msg.partition(), msg.offset())

    producer = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
    for key, headers, timestamp, _ in plan:
        producer.produce(tier.topic, key=key, value=b"v", headers=headers, partition=0,
                         on_delivery=delivered, **({"timestamp": timestamp} if timestamp else {}))
    assert producer.flush(10) == 0

    eventually(lambda: delaying.alive() and caught_up(s, topology.groups.delay, {tier.topic: PARTITIONS["delay"]}),
               timeout_s=60, what="the tier partition committed to its end")
    letters = dead_letters_by_position(s, Codec.from_settings(s))
    assert_dead_lettered(letters, {positions[key]: names for key, _, _, names in plan if key.startswith(b"bad-")})
    assert letters[positions[b"bad-looping"]][1]["reason"].startswith("hop_limit: ")
    assert [m.key() for m in read_topic(s.kafka.bootstrap_servers, topology.expiry)] == [b"ok-due-at-limit"]
    onward = [m for m in read_topic(s.kafka.bootstrap_servers, longest.topic) if m.key() == b"ok-old-timestamp"]
    assert len(onward) == 1 and dict(onward[0].headers())[HOPS_HEADER] == b"1"
