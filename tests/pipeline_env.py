"""A fresh pipeline per test: its own topics, group and database, on the session's Apache Kafka.

Also the readers tests use to check final state on Kafka: every record of a topic up to its end,
and a group's committed offsets.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, TopicPartition

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.settings import Settings, load_settings
from lapse.kernel.topology import delay_tiers
from tests.fixtures_kafka import create_topics

EXPIRY_PARTITIONS = 6


@dataclass
class Pipeline:
    settings: Settings
    engine: object
    codec: Codec

    def with_(self, **changes) -> Settings:
        return self.settings.model_copy(update=changes)


def make_pipeline_settings(bootstrap: str, db_url: str, unique, replication_factor: int = 1,
                           **extra) -> Settings:
    prefix = unique("lapse") + "."
    settings = load_settings(
        bootstrap_servers=bootstrap,
        database_url=db_url,
        expiry_topic=prefix + "expiry",
        outcomes_topic=prefix + "outcomes",
        dlq_topic=prefix + "dlq",
        delay_topic_prefix=prefix + "delay.",
        cleanup_group=unique("cleanup"),
        delay_group=unique("delay"),
        session_timeout_ms=6000,
        poll_timeout_s=0.1,
        log_format="text",
        **extra,
    )
    topics = {settings.expiry_topic: EXPIRY_PARTITIONS, settings.outcomes_topic: 3, settings.dlq_topic: 1}
    topics.update({settings.delay_topic(tier): 2 for tier, _ in delay_tiers()})
    config = {"min.insync.replicas": "2"} if replication_factor >= 3 else None
    create_topics(bootstrap, topics, config=config, replication_factor=replication_factor)
    return settings


@pytest.fixture
def pipeline(kafka_bootstrap, pg_url, unique) -> Pipeline:
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique)
    engine = make_engine(pg_url)
    yield Pipeline(settings, engine, Codec.from_settings(settings))
    engine.dispose()


def read_topic(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every record on `topic` from the beginning to the end seen at partition EOF."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lapse-test-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in meta.partitions]
        consumer.assign(parts)
        pending, records = {p.partition for p in parts}, []
        import time

        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    pending.discard(msg.partition())
                continue
            records.append(msg)
        if pending:
            raise TimeoutError(f"partitions {sorted(pending)} of {topic} not read to the end")
        return records
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (-1001 when nothing is committed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lapse-test-reader"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1]
                for p in range(partitions)}
    finally:
        consumer.close()
