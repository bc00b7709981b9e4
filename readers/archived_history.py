"""One operation's history from the archive and the topics (`lapse show OP_KEY --archive URL`): its
records on the expiry, outcomes and dead-letter topics — from the archive's files for the offsets
the topics no longer hold, then from the topics — and its transitions kept in the archive, which
outlive the ledger's horizon.

Records are found by their key (the op key), in every partition: no partitioner is assumed. The
read is bounded by the window (`since`, `until`): archived files whose records all lie outside it
are skipped, and the topics are read from the first offset at `since`. A file that is missing or
altered is named in `damaged`, never read.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from lapse.archive import ArchiveReader, FileDamaged
from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.ledger import millis
from lapse.kernel.schema_names import CLEANUP_OUTCOME, DEAD_LETTER_RECORD, EXPIRY_EVENT
from lapse.kernel.settings import Settings
from lapse.readers.coverage import Window
from lapse.readers.history import RECORD_FIELDS, iso, topic_role
from lapse.readers.offsets import UNBOUNDED, Span, manual_consumer, read_spans, starts

_TRANSITION_FIELDS = ("id", "from_state", "to_state", "attempt", "failure_class", "reason", "actor", "replay_id",
                      "correlation_id", "event_topic", "event_partition", "event_offset")


def archived_operation(settings: Settings, archive: ArchiveReader, op_key: str, since: datetime | None,
                       until: datetime | None) -> dict[str, Any]:
    """The op key's records (oldest first, each saying whether the archive or the topic gave it),
    its archived transitions, and the archive files that could not be read."""
    window = Window(millis(since) if since else None, millis(until) if until else None)
    key = op_key.encode()
    codec = Codec.from_settings(settings)
    schemas = {settings.topology.expiry: EXPIRY_EVENT, settings.topology.outcomes: CLEANUP_OUTCOME,
               settings.topology.dlq: DEAD_LETTER_RECORD}
    damaged: list[str] = []
    records = []
    for topic, partition, offset, ts_ms, value, source in _keyed(settings, archive, key, schemas, window, damaged):
        try:
            decoded = {f: iso(v) if isinstance(v, datetime) else v
                       for f, v in codec.decode_fields(schemas[topic], value, RECORD_FIELDS).items()}
        except DecodeError as exc:
            decoded = {"undecodable": exc.reason}
        records.append({"topic": topic, "role": topic_role(settings.topology, topic), "partition": partition,
                        "offset": offset, "at": iso(datetime.fromtimestamp(ts_ms / 1000, UTC)), "from": source,
                        "record": decoded})
    transitions = []
    for entry in archive.transition_entries():
        if not window.may_hold(entry):
            continue
        try:
            transitions += [{**{f: row[f] for f in _TRANSITION_FIELDS}, "at": iso(row["at"])}
                            for row in archive.transitions(entry) if row["op_key"] == op_key]
        except FileDamaged as exc:
            damaged.append(str(exc))
    return {"url": archive.url, "records": sorted(records, key=lambda r: (r["at"], r["topic"], r["offset"])),
            "transitions": sorted(transitions, key=lambda t: t["id"]), "damaged": damaged}


def _keyed(settings: Settings, archive: ArchiveReader, key: bytes, schemas: dict[str, str], window: Window,
           damaged: list[str]) -> Iterator[tuple[str, int, int, int, bytes, str]]:
    """(topic, partition, offset, timestamp, value, "archive" | "topic") of the records keyed `key`."""
    consumer = manual_consumer(settings)
    try:
        spans = []
        since = None if window.since_ms is None else datetime.fromtimestamp(window.since_ms / 1000, UTC)
        for topic in schemas:
            for part in starts(consumer, topic, since):
                yield from _archived(archive, topic, part.partition, part.low, key, window, damaged)
                spans.append(Span(topic, part.partition, part.start, UNBOUNDED))  # partition EOF ends it
        for msg in read_spans(consumer, spans):
            held_by, partition, offset = msg.topic(), msg.partition(), msg.offset()
            ts_ms = msg.timestamp()[1]
            if msg.key() == key and held_by is not None and partition is not None and offset is not None \
                    and window.holds(ts_ms):
                yield held_by, partition, offset, ts_ms, msg.value() or b"", "topic"
    finally:
        consumer.close()


def _archived(archive: ArchiveReader, topic: str, partition: int, low: int, key: bytes, window: Window,
              damaged: list[str]) -> Iterator[tuple[str, int, int, int, bytes, str]]:
    for entry in archive.topic_entries(topic, partition, below=low):
        if not window.may_hold(entry):
            continue
        try:
            for record in archive.records(topic, entry):
                if record.offset < low and record.key == key and window.holds(record.timestamp_ms):
                    yield topic, partition, record.offset, record.timestamp_ms, record.value or b"", "archive"
        except FileDamaged as exc:
            damaged.append(str(exc))
