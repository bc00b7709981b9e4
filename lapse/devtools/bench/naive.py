"""The per-message baselines, hand-written (lapse.devtools.bench.lean), never through `apply_batch`:

- `naive`: one consumer, per message one transaction of the lean statements, then a synchronous
  offset commit of that message — the way most teams first write it;
- `batched_naive`: consume up to 500, one transaction of the same statements as executemany over
  the batch, then one synchronous commit of the batch's offsets — what a good engineer writes in a day.

Both run in the stage's cleanup group on the stage's expiry topic and database, and are timed the
way every stage is (lapse.devtools.bench.ledger_watch: first ledger row created → last row seen
terminal).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from lapse.devtools.bench.lean import LeanSql, apply_many, apply_one, driver_connection
from lapse.devtools.bench.ledger_watch import ledger_span, wait_terminal
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_consumer
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import Settings

BATCHED_NAIVE_BATCH = 500


def run_naive(settings: Settings, events: int) -> dict[str, Any]:
    """One transaction and one synchronous offset commit per message, for the first `events`
    records of the stage's expiry topic."""
    codec = Codec.from_settings(settings)
    outcomes = settings.topology.outcomes

    def step(consumer: Consumer, conn: Any, sql: LeanSql) -> int:
        msg = consumer.poll(1.0)
        if msg is None or _eof(msg):
            return 0
        now = datetime.now(UTC)
        event = ExpiryEvent.from_record(codec.decode_expected(EXPIRY_EVENT, msg.value() or b""))
        _in_transaction(conn, lambda: apply_one(conn, sql, event, worker="bench-naive",
                                                outcomes_topic=outcomes, now=now))
        consumer.commit(message=msg, asynchronous=False)
        return 1

    return _drain(settings, events, step)


def run_batched_naive(settings: Settings, events: int, batch: int = BATCHED_NAIVE_BATCH) -> dict[str, Any]:
    """Consume up to `batch` records, one transaction of executemany statements over them, one
    synchronous commit of their offsets; until `events` records are done."""
    codec = Codec.from_settings(settings)
    outcomes = settings.topology.outcomes

    def step(consumer: Consumer, conn: Any, sql: LeanSql) -> int:
        messages = [m for m in consumer.consume(batch, 1.0) if not _eof(m)]
        if not messages:
            return 0
        now = datetime.now(UTC)
        decoded = [ExpiryEvent.from_record(codec.decode_expected(EXPIRY_EVENT, m.value() or b""))
                   for m in messages]
        _in_transaction(conn, lambda: apply_many(conn, sql, decoded, worker="bench-batched-naive",
                                                 outcomes_topic=outcomes, now=now))
        consumer.commit(offsets=_next_offsets(messages), asynchronous=False)
        return len(messages)

    result = _drain(settings, events, step)
    return {**result, "batch_size": batch}


def _in_transaction(conn: Any, work: Callable[[], object]) -> None:
    """Run `work` and commit, or roll back and raise: one transaction of the driver connection."""
    try:
        work()
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _drain(settings: Settings, events: int, step: Callable[[Consumer, Any, LeanSql], int]) -> dict[str, Any]:
    """Run `step` (records done per call) until `events` records are done, in the stage's cleanup group; the rate."""
    engine = engine_from_settings(settings)
    topology = settings.topology
    consumer = make_consumer(settings, topology.groups.cleanup)
    raw, conn = driver_connection(engine)
    try:
        consumer.subscribe([topology.expiry])
        sql = LeanSql.for_engine(engine)
        done = 0
        while done < events:
            done += step(consumer, conn, sql)
        span = ledger_span(engine, events, wait_terminal(engine, events))
    finally:
        consumer.close()
        raw.close()
        engine.dispose()
    return {"events": events, "seconds": round(span.seconds, 3), "events_per_s": round(span.rate, 1)}


def _eof(msg: Message) -> bool:
    """True for a partition-EOF event; raises for any other consumer error."""
    err = msg.error()
    if err is None:
        return False
    if err.code() == KafkaError._PARTITION_EOF:
        return True
    raise KafkaException(err)


def _next_offsets(messages: list[Message]) -> list[TopicPartition]:
    """The next offset to read of every partition in `messages` (last processed + 1)."""
    last: dict[tuple[str, int], int] = {}
    for m in messages:
        key = (m.topic() or "", m.partition() or 0)
        last[key] = max(last.get(key, -1), m.offset() or 0)
    return [TopicPartition(topic, partition, offset + 1) for (topic, partition), offset in last.items()]
