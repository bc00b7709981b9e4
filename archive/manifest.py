"""The manifest: one entry per archived file — its stream, the offsets it holds, how many records,
its SHA-256 and size, and the times of its records — written create-only after the file is
durable. A stream's entries, in offset order, are the chain of what it archived: an entry is the
commit point of its file, and a file no entry names is not part of the archive.

Entries are read back from a store anyone with access could change, so each is checked as outside
input: the JSON's shape and types, offsets in order, a SHA-256 of 64 hex digits, a file key inside
its own stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from lapse.archive.locations import OFFSET_DIGITS, entry_key, manifest_folder
from lapse.archive.stores import ArchiveStore
from lapse.kernel.text import one_line

FORMAT = 1
MAX_ENTRY_BYTES = 64 * 1024
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ENTRY_NAME = re.compile(rf"^(\d{{{OFFSET_DIGITS}}})\.json$")
_INT_FIELDS = ("partition", "first", "last", "records", "size")
_TIME_FIELDS = ("first_ms", "last_ms", "min_ms", "max_ms", "closed_ms")


class ManifestError(ValueError):
    """A manifest entry that is not one this archive writes; str(self) is one line."""


@dataclass(frozen=True)
class ManifestEntry:
    """One archived file of `stream`: offsets [first, last] (for transitions: transaction ids),
    `records` records in `file` (None for a window that held none), its `sha256` and `size` in bytes; the
    times (epoch ms) of its first and last record by offset and the earliest and latest;
    `closed_ms` the database's time the transitions window closed (None for topics)."""

    stream: str
    partition: int
    first: int
    last: int
    records: int
    file: str | None
    sha256: str | None
    size: int
    first_ms: int | None
    last_ms: int | None
    min_ms: int | None
    max_ms: int | None
    closed_ms: int | None = None

    @property
    def end(self) -> int:
        """The offset after the last one."""
        return self.last + 1

    @property
    def key(self) -> str:
        return entry_key(self.stream, self.first)

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, stream: str, first: int) -> ManifestEntry:
        """The entry `data` holds, checked to be `stream`'s entry for `first`; ManifestError otherwise."""
        where = f"manifest entry {entry_key(stream, first)}"
        if len(data) > MAX_ENTRY_BYTES:
            raise ManifestError(f"{where}: larger than {MAX_ENTRY_BYTES} bytes")
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            raise ManifestError(f"{where}: not JSON") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ManifestError(f"{where}: not a format-{FORMAT} manifest entry")
        doc.pop("format")
        expected = {f for f in cls.__dataclass_fields__}
        if set(doc) != expected:
            odd = sorted(set(doc) ^ expected)[0]
            raise ManifestError(f"{where}: unexpected or missing field {one_line(str(odd), 40)!r}")
        _check(doc, where, stream, first)
        return cls(**doc)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


def _check(doc: dict[str, Any], where: str, stream: str, first: int) -> None:
    if not all(_is_int(doc[f]) for f in _INT_FIELDS):
        raise ManifestError(f"{where}: {', '.join(_INT_FIELDS)} must be non-negative integers")
    if not all(doc[f] is None or _is_int(doc[f]) for f in _TIME_FIELDS):
        raise ManifestError(f"{where}: times must be epoch milliseconds")
    if doc["stream"] != stream or doc["first"] != first or doc["last"] < first:
        raise ManifestError(f"{where}: names another stream or offsets out of order")
    if doc["records"] > doc["last"] - first + 1 and not stream.startswith("tables/"):
        raise ManifestError(f"{where}: more records than offsets")
    if doc["file"] is None:
        if doc["records"] or doc["sha256"] is not None:
            raise ManifestError(f"{where}: records without a file")
        return
    if not isinstance(doc["file"], str) or not doc["file"].startswith(stream + "/") or ".." in doc["file"]:
        raise ManifestError(f"{where}: its file is not in its stream")
    if not isinstance(doc["sha256"], str) or not _SHA256.fullmatch(doc["sha256"]):
        raise ManifestError(f"{where}: sha256 must be 64 lower-case hex digits")


def _entry_keys(store: ArchiveStore, stream: str, from_first: int | None) -> Iterator[tuple[str, int]]:
    folder = manifest_folder(stream)
    after = None if not from_first else entry_key(stream, from_first - 1)
    for key in store.keys(folder, start_after=after):
        match = _ENTRY_NAME.fullmatch(key[len(folder):])
        if match is not None:  # anything else is not an entry (an operator's note, a temporary file)
            yield key, int(match.group(1))


def entries(store: ArchiveStore, stream: str, *, from_first: int | None = None,
            below: int | None = None) -> Iterator[ManifestEntry]:
    """The entries of `stream` in offset order (from the one whose first offset is `from_first`, and
    up to those whose first offset is below `below`, if given; one small read each); an entry that
    fails its checks raises ManifestError."""
    for key, first in _entry_keys(store, stream, from_first):
        if below is not None and first >= below:
            return
        data = store.read(key)
        if data is not None:
            yield ManifestEntry.from_json(data, stream, first)


def last_entry(store: ArchiveStore, stream: str, *, from_first: int | None = None) -> ManifestEntry | None:
    """The entry of `stream` with the highest first offset (at or after `from_first`), None when
    there is none: the end of its chain, read with one listing and one object."""
    last = None
    for last in _entry_keys(store, stream, from_first):  # noqa: B007 — the last key is wanted
        pass
    if last is None:
        return None
    data = store.read(last[0])
    return None if data is None else ManifestEntry.from_json(data, stream, last[1])
