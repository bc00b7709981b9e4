"""Segments: the open file of one stream partition, and the commit order that makes it part of the
archive (docs/design/archive.md says why it is exact):

1. the segment's spool file is sealed (synced, hashed);
2. it is stored under a key named by its stream, hour and offsets (`put_file`, durable on return;
   a retry after a crash writes the same offsets to the same key, replacing, never appending);
3. its manifest entry is created only if absent (`create`): the commit point. When another writer
   created that entry first, its entry stands and this segment is dropped;
4. only then the consumer group's offset is committed (by the caller), which is a hint for the
   next owner: the manifest, not the group, says where the archive ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lapse.archive.files import FileFormat, Spool
from lapse.archive.locations import data_key
from lapse.archive.manifest import ManifestEntry
from lapse.archive.stores import ArchiveStore, ArchiveUnavailable


@dataclass
class Segment:
    """The records of one file being written: offsets [first, last], their count and times, the
    span `bucket` (span start, epoch ms) its first record fell in."""

    spool: Spool
    first: int
    bucket: int
    last: int = -1
    records: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    min_ms: int | None = None
    max_ms: int | None = None

    def took(self, offset: int, ts_ms: int) -> None:
        """Count one record appended to the spool."""
        self.last, self.records = offset, self.records + 1
        self.first_ms = ts_ms if self.first_ms is None else self.first_ms
        self.last_ms = ts_ms
        self.min_ms = ts_ms if self.min_ms is None else min(self.min_ms, ts_ms)
        self.max_ms = ts_ms if self.max_ms is None else max(self.max_ms, ts_ms)


@dataclass
class Committed:
    """The entry that stands for a segment's first offset; `ours`: this writer created it."""

    entry: ManifestEntry
    ours: bool


def commit_segment(store: ArchiveStore, stream: str, partition: int, segment: Segment, *,
                   last: int | None = None, closed_ms: int | None = None,
                   after_file: Callable[[], None] | None = None) -> Committed:
    """Steps 1 to 3 of the commit order for `segment` (`last`: the window's last id, for a transitions
    window that may end past its last row; `after_file`: called between steps 2 and 3, a test's
    crash point). Raises what the store raises; the spool is discarded either way."""
    try:
        sealed = segment.spool.seal() if segment.records else None
        last = segment.last if last is None else last
        key = data_key(stream, segment.first, last, segment.first_ms) if sealed else None
        if sealed is not None and key is not None:
            store.put_file(key, sealed.path)
            if after_file is not None:
                after_file()
        entry = ManifestEntry(stream=stream, partition=partition, first=segment.first, last=last,
                              records=segment.records, file=key, sha256=sealed.sha256 if sealed else None,
                              size=sealed.size if sealed else 0, first_ms=segment.first_ms,
                              last_ms=segment.last_ms, min_ms=segment.min_ms, max_ms=segment.max_ms,
                              closed_ms=closed_ms)
        if store.create(entry.key, entry.to_json()):
            return Committed(entry, ours=True)
        data = store.read(entry.key)
        if data is None:  # removed between our create and read: an operator's hand; try again later
            raise ArchiveUnavailable(f"manifest entry {entry.key} vanished while it was read")
        return Committed(ManifestEntry.from_json(data, stream, segment.first), ours=False)
    finally:
        segment.spool.discard()


@dataclass
class PartitionArchive:
    """Where one topic partition's archive stands: `committed` the offset after its manifest's
    last entry (None: nothing archived, read from the earliest), `segment` the open file."""

    topic: str
    partition: int
    stream: str
    committed: int | None
    form: FileFormat
    spool_dir: Path
    span_ms: int
    max_records: int
    segment: Segment | None = None
    at_end: bool = False
    skipped: list[tuple[int, int]] = field(default_factory=list)  # holes: (expected, found) offsets

    @property
    def position(self) -> int | None:
        """The next offset to archive."""
        return self.segment.last + 1 if self.segment is not None else self.committed

    def bucket(self, ts_ms: int) -> int:
        return ts_ms - ts_ms % self.span_ms

    def full_before(self, offset: int, ts_ms: int) -> Segment | None:
        """The open segment, when the record at `offset` cannot join it: a later span, the most
        records a file holds, or offsets that do not follow on (the topic lost some)."""
        seg = self.segment
        if seg is None:
            return None
        if self.bucket(ts_ms) > seg.bucket or seg.records >= self.max_records or offset != seg.last + 1:
            return seg
        return None

    def append(self, offset: int, record: dict[str, object], ts_ms: int) -> None:
        """Add the record at `offset` (following `full_before`'s answer, which was None)."""
        if self.segment is None:
            if self.committed is not None and offset > self.committed:
                self.skipped.append((self.committed, offset))
            metadata = {"lapse.topic": self.topic, "lapse.partition": str(self.partition)}
            self.segment = Segment(Spool(self.form, self.spool_dir, metadata), offset, self.bucket(ts_ms))
        self.segment.spool.append(record)
        self.segment.took(offset, ts_ms)

    def due(self, now_ms: int, close_after_ms: int) -> bool:
        """Whether the open segment's span ended more than `close_after_ms` ago."""
        return self.segment is not None and now_ms >= self.segment.bucket + self.span_ms + close_after_ms

    def committed_to(self, end: int) -> None:
        """The manifest now ends at `end`: the open segment is gone (committed or dropped)."""
        self.segment = None
        self.committed = end

    def drop(self) -> None:
        """Forget the open segment (revoked, or a rewind after a store failure)."""
        if self.segment is not None:
            self.segment.spool.discard()
            self.segment = None
