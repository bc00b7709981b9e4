"""The archive room: the expiry events, outcomes and dead letters, and the ledger's transitions,
kept as files beyond the topics' retention and the ledger's horizons — written by the archive
role (one consumer group, one file per partition and span, a manifest of offsets and checksums)
and read back by the audit and `lapse show`. This module is the room's face."""

from lapse.archive.archiver import Archiver, ArchiveStats
from lapse.archive.files import FileDamaged
from lapse.archive.locations import TRANSITIONS, ArchiveUrlError, parse_archive_url
from lapse.archive.manifest import ManifestEntry, ManifestError
from lapse.archive.opening import check_writable, open_store
from lapse.archive.reader import ArchivedRecord, ArchiveReader
from lapse.archive.stores import ArchiveRefused, ArchiveStore, ArchiveUnavailable

__all__ = [
    "TRANSITIONS",
    "ArchiveReader",
    "ArchiveRefused",
    "ArchiveStats",
    "ArchiveStore",
    "ArchiveUnavailable",
    "ArchiveUrlError",
    "ArchivedRecord",
    "Archiver",
    "FileDamaged",
    "ManifestEntry",
    "ManifestError",
    "check_writable",
    "open_store",
    "parse_archive_url",
]
