"""The archiver: one consumer in the archive's own group, reading the expiry, outcomes and dead
letter topics and writing each partition's records to files, one per partition and file span, in
the commit order of `segments`; the member that owns the expiry topic's partition 0 also archives
the ledger's transitions (`transitions`).

Where a partition resumes is the manifest's word: on assignment the archiver starts after the last
entry at or past the group's committed offset (the offset is committed after the entry, so it can
only be behind). An open segment is dropped when its partition is revoked, and everything open is
dropped and read again from the manifest's end when the store fails: a file is written whole or
not at all, never appended to. Time — when a quiet partition's file closes — is the database's.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from sqlalchemy import Engine

from lapse.archive.files import RECORDS
from lapse.archive.locations import topic_stream
from lapse.archive.manifest import last_entry
from lapse.archive.segments import PartitionArchive, commit_segment
from lapse.archive.stores import ArchiveStore, ArchiveUnavailable
from lapse.archive.transitions import TransitionsArchive
from lapse.kernel.clock import engine_now
from lapse.kernel.kafka_clients import make_consumer
from lapse.kernel.ledger import millis
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, is_transient
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line

log = get_logger("archive")
CLOCK_EVERY_S = 1.0  # how often the database's now is read to close quiet partitions' files


@dataclass
class ArchiveStats:
    """What one archiver did: topic files committed and the records in them, transitions archived,
    holes met (offsets gone from a topic before they were archived)."""

    files: int = 0
    records: int = 0
    transitions: int = 0
    holes: int = 0


class Archiver:
    """One member of the archive group; `run` until stopped or idle."""

    def __init__(self, settings: Settings, store: ArchiveStore, engine: Engine, *,
                 stop: threading.Event | None = None) -> None:
        archive = settings.archive
        group = settings.topology.groups.archive
        if group is None:
            raise ValueError("topics.yaml declares no archive group (groups.archive)")
        self.settings = settings
        self.store = store
        self.engine = engine
        self.stop = stop or threading.Event()
        self.stats = ArchiveStats()
        self.topics = [settings.topology.expiry, settings.topology.outcomes, settings.topology.dlq]
        self.span_ms = int(archive.file_span_s * 1000)
        self.close_after_ms = int(archive.close_after_s * 1000)
        self._spool = tempfile.TemporaryDirectory(prefix="lapse-archive-")
        self.spool_dir = Path(self._spool.name)
        self.parts: dict[tuple[str, int], PartitionArchive] = {}
        self.transitions = TransitionsArchive(store, engine, self.spool_dir, self.span_ms, self.close_after_ms,
                                              timedelta(seconds=archive.transitions_lookback_s))
        self.consumer: Consumer = make_consumer(settings, group)
        self.outage = Outage("archive", log)
        self._now_ms = 0
        self._now_read = 0.0
        self._assigned_at = time.monotonic()

    # --- the group's word --------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Resume each partition after its manifest's end (waiting out a coordinator that moves and
        a store that does not answer: the assignment must be taken here, or not at all)."""
        hints = self._committed(consumer, partitions)
        for tp in partitions:
            key = (tp.topic, tp.partition)
            hint = hints.get(key, -1)
            end = self._manifest_end(topic_stream(*key), hint if hint >= 0 else None)
            if self.stop.is_set():
                return
            resume = end if end is not None else (hint if hint >= 0 else None)
            self.parts[key] = PartitionArchive(tp.topic, tp.partition, topic_stream(*key), resume, RECORDS,
                                               self.spool_dir, self.span_ms, self.settings.archive.max_file_records)
            tp.offset = OFFSET_BEGINNING if resume is None else resume
        consumer.assign(partitions)
        self._assigned_at = time.monotonic()
        if (self.settings.topology.expiry, 0) in self.parts:
            self.transitions.loaded = False  # read the transitions' chain again: another owner may have moved it
        log.info("partitions assigned", extra={"partitions": [f"{tp.topic}[{tp.partition}]@{tp.offset}"
                                                              for tp in partitions]})

    def _committed(self, consumer: Consumer, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
        """The group's committed offsets of `partitions` (-1001 where none), asked until answered."""
        while not self.stop.is_set():
            try:
                found = consumer.committed(partitions, timeout=30)
                self.outage.over()
                return {(tp.topic, tp.partition): tp.offset for tp in found}
            except KafkaException as exc:
                if not is_transient(exc):
                    raise
                self.outage.wait(exc, self.stop)
        return {}

    def _manifest_end(self, stream: str, hint: int | None) -> int | None:
        while not self.stop.is_set():
            try:
                entry = last_entry(self.store, stream, from_first=hint)
                self.outage.over()
                return None if entry is None else entry.end
            except ArchiveUnavailable as exc:
                self.outage.wait(exc, self.stop)
        return None

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Give the partitions up: their open files are dropped, the next owner reads them again."""
        for tp in partitions:
            part = self.parts.pop((tp.topic, tp.partition), None)
            if part is not None:
                part.drop()
        log.info("partitions revoked", extra={"partitions": [f"{tp.topic}[{tp.partition}]" for tp in partitions]})

    # --- the loop ----------------------------------------------------------------------------------

    def run(self, exit_when_idle: float | None = None) -> ArchiveStats:
        """Archive until stopped, or (with `exit_when_idle`) until every partition was read to its
        end, its files closed and nothing arrived for that many seconds."""
        self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)
        last_activity = time.monotonic()
        try:
            while not self.stop.is_set():
                try:
                    messages = self.consumer.consume(500, self.settings.processor.poll_timeout_s)
                    if self._take(messages):
                        last_activity = time.monotonic()
                    closed = self._close_due(flush=False)
                    if exit_when_idle is not None and self._idle(last_activity, exit_when_idle):
                        if not self._close_due(flush=True):
                            break
                        last_activity = time.monotonic()
                    elif closed:
                        last_activity = time.monotonic()
                    self.outage.over()
                except ArchiveUnavailable as exc:
                    self._rewind()
                    self.outage.wait(exc, self.stop)
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    self._rewind()
                    self.outage.wait(exc, self.stop)
        finally:
            self.close()
        return self.stats

    def _take(self, messages: list[Message]) -> bool:
        """Add the consumed records to their partitions' files; whether any was a record."""
        took = False
        moved: set[tuple[str, int]] = set()  # seeked in this batch: their later records here are stale
        for msg in messages:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            if topic is None or partition is None or offset is None or (topic, partition) in moved:
                continue
            part = self.parts.get((topic, partition))
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if part is not None and offset >= (part.position or 0):
                        part.at_end = True
                elif err.fatal():
                    raise KafkaException(err)
                continue
            if part is None or (part.position is not None and offset < part.position):
                continue  # not ours, or archived already
            took, part.at_end = True, False
            ts_type, ts_ms = msg.timestamp()
            if part.full_before(offset, ts_ms) is not None and not self._commit(part):
                moved.add((topic, partition))
                continue
            part.append(offset, _record(msg, offset, ts_type, ts_ms), ts_ms)
            if part.skipped:
                expected, found = part.skipped.pop()
                self.stats.holes += 1
                log.error("offsets gone from the topic before they were archived: a gap in the archive",
                          extra={"topic": topic, "partition": partition, "first_offset": expected,
                                 "end_offset": found})
        return took

    def _close_due(self, *, flush: bool) -> int:
        """Commit the files whose span ended `close_after` ago by the database's clock (all open
        files with `flush`), and the transitions window when due; how many were committed."""
        now_ms = self._database_now_ms()
        closed = 0
        for part in list(self.parts.values()):
            if part.segment is not None and (flush or part.due(now_ms, self.close_after_ms)):
                self._commit(part)
                closed += 1
        if (self.settings.topology.expiry, 0) in self.parts and (flush or self.transitions.due(now_ms)):
            entry = self.transitions.close_window()
            if entry is not None and entry.records:  # a window of other writes only is no work done
                closed += 1
                self.stats.transitions += entry.records
        return closed

    def _commit(self, part: PartitionArchive) -> bool:
        """Commit the partition's open file (steps 1 to 3), then the group's offset (step 4). False when
        another member's file stood for it: the partition then resumes after that member's chain."""
        assert part.segment is not None
        segment, part.segment = part.segment, None
        committed = commit_segment(self.store, part.stream, part.partition, segment,
                                   after_file=lambda: self._crash_if("archive_after_file"))
        if not committed.ours:
            # Another member wrote this offset's file first (a rebalance we had not heard of yet):
            # its chain stands; resume after it.
            end = last_entry(self.store, part.stream, from_first=committed.entry.first)
            part.committed_to(end.end if end is not None else committed.entry.end)
            assert part.committed is not None
            self.consumer.seek(TopicPartition(part.topic, part.partition, part.committed))
            log.info("another archive member wrote this file first", extra={
                "topic": part.topic, "partition": part.partition, "first_offset": segment.first})
            return False
        self._crash_if("archive_after_manifest")
        part.committed_to(committed.entry.end)
        self.stats.files += 1
        self.stats.records += committed.entry.records
        try:
            self.consumer.commit(offsets=[TopicPartition(part.topic, part.partition, committed.entry.end)],
                                 asynchronous=False)
        except KafkaException as exc:  # a hint only: the manifest says where the archive ends
            log.warning("offset commit refused (the manifest still says where the archive ends)",
                        extra={"topic": part.topic, "partition": part.partition, "error": str(exc)})
        return True

    def _rewind(self) -> None:
        """Drop every open file and read each partition again from its manifest's end. A seek the
        client refuses ends the run: resuming past dropped records would leave a hole, a restart
        resumes from the manifest."""
        for part in self.parts.values():
            part.drop()
            part.at_end = False  # what it read is read again: it is not at its end before that
            offset = OFFSET_BEGINNING if part.committed is None else part.committed
            self.consumer.seek(TopicPartition(part.topic, part.partition, offset))

    def _crash_if(self, point: str) -> None:
        """Test hook: die without cleanup at a named point of the commit order, as a killed process would."""
        if self.settings.dev.crash_point == point:
            os._exit(17)

    def _idle(self, last_activity: float, idle_s: float) -> bool:
        """Every owned partition read to its end, nothing for `idle_s`, and the group still for two
        session timeouts since it last moved: a member killed while it joined is handed partitions
        with this one and keeps them until its session expires after that rebalance, and the next
        one may hand them here (its session, then a heartbeat, then the rejoin). A member with no
        partitions waits as long after it last did anything."""
        now = time.monotonic()
        settle_s = 2 * self.settings.processor.session_timeout_ms / 1000
        if not self.parts:  # nothing of ours yet: a rebalance may still hand some
            return now - last_activity >= idle_s + settle_s
        return (all(p.at_end for p in self.parts.values()) and now - self._assigned_at >= settle_s
                and now - last_activity >= idle_s)

    def _database_now_ms(self) -> int:
        if time.monotonic() - self._now_read >= CLOCK_EVERY_S:
            self._now_ms = millis(engine_now(self.engine))
            self._now_read = time.monotonic()
        return self._now_ms

    def close(self) -> None:
        """Leave the group (open files are dropped: the next owner reads them again) and remove the spool."""
        for part in self.parts.values():
            part.drop()
        try:
            self.consumer.close()
        finally:
            self._spool.cleanup()


def _record(msg: Message, offset: int, ts_type: int, ts_ms: int) -> dict[str, Any]:
    """The archived form of one record: as the topic held it (a consumed record's headers are a
    list of (name, bytes) pairs). Headers the client cannot hand over (a name that is not UTF-8)
    are noted, not a crash: the record is archived all the same."""
    unreadable = None
    try:
        headers = msg.headers() or []
    except Exception as exc:
        headers, unreadable = [], one_line(f"{type(exc).__name__}: {exc}", 200, escape=True)
    pairs = headers.items() if isinstance(headers, dict) else headers
    return {"offset": offset, "timestamp": ts_ms, "timestamp_type": ts_type, "key": msg.key(),
            "value": msg.value(), "headers": [{"key": k, "value": v} for k, v in pairs],
            "headers_unreadable": unreadable}
