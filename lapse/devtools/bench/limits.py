"""The consumer alone (consume and decode, no database), half of the limit (`bound` is the other
half), and the processor's batch transaction alone (no Kafka), measured in the same run as Lapse."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from io import BytesIO
from typing import Any

import fastavro
from confluent_kafka import KafkaError, KafkaException

from lapse.devtools.demo_kinds import load_demo_kinds
from lapse.kernel.codec import CONFLUENT_MAGIC, SINGLE_OBJECT_HEADER_LEN, Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.heap import set_aside_startup_heap
from lapse.kernel.kafka_clients import make_consumer
from lapse.kernel.ledger import ExpiryEvent, expiry_record
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import Settings
from lapse.processors import BatchScope, apply_batch, decode_event


def batch_transaction_alone(settings: Settings, events: Sequence[ExpiryEvent],
                            worker: str = "bench-txn") -> dict[str, Any]:
    """Run apply_batch over pre-decoded events, one transaction per batch of the stage's batch size,
    as the processor does (on the stage's database and topology)."""
    lease = timedelta(seconds=30)
    batch_size = settings.processor.batch_size
    engine = engine_from_settings(settings)
    kinds = load_demo_kinds(engine)
    try:
        set_aside_startup_heap()  # the heap as a worker's is once it started
        started = time.perf_counter()
        for start in range(0, len(events), batch_size):
            with engine.begin() as conn:
                apply_batch(BatchScope(conn, kinds=kinds, topics=settings.topology, worker=worker,
                                       now=datetime.now(UTC), lease=lease), events[start:start + batch_size])
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    return {"events": len(events), "batch_size": batch_size, "seconds": round(seconds, 3),
            "events_per_s": round(len(events) / seconds, 1)}


def consumer_limit(settings: Settings, events: int, passes: int = 2) -> dict[str, Any]:
    """Consume the stage's expiry topic and decode and validate every record as the processor does
    (Codec, ExpiryEvent.from_record), in batches of the stage's batch size, until `events` are
    decoded; no database. Each pass reads the whole topic in a group of its own (the stage's cleanup
    group, then `-pass2`, …); the best pass counts, the first one warming the broker and the client
    as the earlier stages warm them for Lapse. A pass is timed from its first record consumed to its
    last decoded (joining the group is not reading)."""
    runs = [_consume_and_decode(settings, settings.topology.groups.cleanup + (f"-pass{i + 1}" if i else ""), events)
            for i in range(max(1, passes))]
    done, seconds = max(runs, key=lambda run: run[0] / run[1] if run[1] else 0.0)
    return {"events": done, "batch_size": settings.processor.batch_size, "seconds": round(seconds, 3),
            "events_per_s": round(done / seconds, 1) if seconds else None,
            "method": f"group consumer, consume() batches, Codec decode + ExpiryEvent.from_record; "
                      f"best of {passes} passes"}


def _consume_and_decode(settings: Settings, group: str, events: int) -> tuple[int, float]:
    """(records decoded, seconds from the first consumed to the last decoded) reading the stage's
    expiry topic in `group` until `events` are decoded."""
    topology = settings.topology
    codec = Codec.from_settings(settings)
    batch, timeout = settings.processor.batch_size, settings.processor.poll_timeout_s
    consumer = make_consumer(settings, group)
    consumer.subscribe([topology.expiry])
    done, started = 0, None
    try:
        while done < events:
            for msg in consumer.consume(batch, timeout):
                err = msg.error()
                if err is None:
                    started = started or time.perf_counter()
                    ExpiryEvent.from_record(codec.decode_expected(EXPIRY_EVENT, msg.value() or b""))
                    done += 1
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
        return done, time.perf_counter() - (started or time.perf_counter())
    finally:
        consumer.close()


def decode_cost(settings: Settings, events: Sequence[ExpiryEvent], repeats: int = 5) -> dict[str, Any]:
    """Decoding and validating each record as the worker does (`decode_event`: framing, schema,
    every field checked, the event made) against fastavro's own read of the same bodies with the
    same writer schema; per event, the best of `repeats` passes each, no Kafka."""
    codec = Codec.from_settings(settings)
    now = datetime.now(UTC)
    values = [codec.encode(EXPIRY_EVENT, expiry_record(event, now)) for event in events]
    writer = fastavro.parse_schema(json.loads(codec.store.current[EXPIRY_EVENT].schema_json))
    # The body after the framing: Confluent's 5 bytes with a registry, else Avro's single-object header.
    offset = 5 if values[0][0] == CONFLUENT_MAGIC else SINGLE_OBJECT_HEADER_LEN

    def fastavro_alone() -> None:
        for value in values:
            body = BytesIO(value)
            body.seek(offset)
            fastavro.schemaless_reader(body, writer, None)

    def lapse_decode() -> None:
        for value in values:
            decode_event(value, codec, {}, now)

    def best(run: Callable[[], None]) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return min(times) / len(values) * 1e6

    ours, theirs = best(lapse_decode), best(fastavro_alone)
    return {"events": len(values), "decode_us": round(ours, 2), "fastavro_us": round(theirs, 2),
            "ratio": round(ours / theirs, 2),
            "method": f"decode_event vs fastavro.schemaless_reader on the same bodies, best of {repeats}"}
