"""Reading the archive back: a stream's manifest entries in offset order, and each entry's records
once its file proved to be the one the entry describes (`files.read_verified`). A file that is
missing or altered raises `FileDamaged` before any of its records is given: the audit counts its
offsets as a gap, never as records it read.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lapse.archive.files import RECORDS, TRANSITIONS, FileFormat, read_verified
from lapse.archive.locations import topic_stream, transitions_stream
from lapse.archive.manifest import ManifestEntry, entries
from lapse.archive.opening import open_store
from lapse.archive.stores import ArchiveStore
from lapse.kernel.settings import Settings


@dataclass(frozen=True)
class ArchivedRecord:
    """One archived topic record, as the topic held it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class ArchiveReader:
    """The archive at a URL, for readers of history (the audit, `lapse show`)."""

    def __init__(self, store: ArchiveStore) -> None:
        self.store = store
        self._scratch = tempfile.TemporaryDirectory(prefix="lapse-archive-read-")

    @classmethod
    def open(cls, url: str, settings: Settings) -> ArchiveReader:
        """The reader of the archive `url` names (ArchiveUrlError, ArchiveRefused)."""
        return cls(open_store(url, settings))

    def __enter__(self) -> ArchiveReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return str(self.store.url)

    def topic_entries(self, topic: str, partition: int, *, below: int | None = None) -> list[ManifestEntry]:
        """The manifest entries of one topic partition, by first offset (those of files beginning
        below offset `below`, if given: what a topic no longer holds)."""
        return list(entries(self.store, topic_stream(topic, partition), below=below))

    def transition_entries(self) -> list[ManifestEntry]:
        return list(entries(self.store, transitions_stream()))

    def records(self, topic: str, entry: ManifestEntry) -> Iterator[ArchivedRecord]:
        """The records of `entry`'s file (FileDamaged before any, when it is not that file)."""
        for row in self._rows(entry, RECORDS):
            yield ArchivedRecord(topic, entry.partition, row["offset"], row["timestamp"], row["key"], row["value"],
                                 tuple((h["key"], h["value"]) for h in row["headers"]))

    def transitions(self, entry: ManifestEntry) -> Iterator[dict[str, Any]]:
        """The transitions rows of `entry`'s file (FileDamaged before any, when it is not that file)."""
        yield from self._rows(entry, TRANSITIONS)

    def _rows(self, entry: ManifestEntry, form: FileFormat) -> Iterator[dict[str, Any]]:
        if entry.file is None:
            return
        dest = Path(self._scratch.name) / uuid.uuid4().hex
        try:
            local = self.store.fetch(entry.file, dest)
            yield from read_verified(local, form, entry.sha256, entry.size, f"archive file {entry.file}")
        finally:
            dest.unlink(missing_ok=True)

    def close(self) -> None:
        try:
            self.store.close()
        finally:
            self._scratch.cleanup()
