"""The archive's files: Avro object container files (fastavro, deflate), one schema for a topic's
records and one for the ledger's transitions, written to a local spool file while a segment is
open and read back only after their SHA-256 matched the manifest.

A topic's record is kept exactly as the topic held it — offset, timestamp and its type, key,
value and headers as bytes — so the archive is the topic's records, not a decoding of them: an
expiry event, an outcome, a dead letter or a poison record alike, in the wire format it was
produced in. A reader checks the file's header names this module's schema before fastavro parses
anything else of it (PITFALLS.md: fastavro's C reader and a hostile writer schema).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import fastavro
from fastavro.read import HEADER_SCHEMA, MAGIC
from fastavro.write import Writer

RECORD_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "ArchivedRecord", "namespace": "lapse.archive",
    "doc": "One record of a topic partition, as the topic held it.",
    "fields": [
        {"name": "offset", "type": "long"},
        {"name": "timestamp", "type": "long", "doc": "epoch ms, as the record carries it"},
        {"name": "timestamp_type", "type": "int", "doc": "1 CreateTime, 2 LogAppendTime (librdkafka's codes)"},
        {"name": "key", "type": ["null", "bytes"]},
        {"name": "value", "type": ["null", "bytes"]},
        {"name": "headers", "type": {"type": "array", "items": {
            "type": "record", "name": "Header",
            "fields": [{"name": "key", "type": "string"}, {"name": "value", "type": ["null", "bytes"]}]}}},
        {"name": "headers_unreadable", "type": ["null", "string"], "default": None,
         "doc": "why the client could not hand over the record's headers (then `headers` is empty)"},
    ],
}
_TEXT = ["null", "string"]
TRANSITION_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "ArchivedTransition", "namespace": "lapse.archive",
    "doc": "One row of the ledger's transitions table, with the id of the transaction that wrote it.",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "xid", "type": "long", "doc": "the writing transaction's id (64-bit)"},
        {"name": "op_key", "type": "string"},
        {"name": "from_state", "type": _TEXT},
        {"name": "to_state", "type": "string"},
        {"name": "attempt", "type": "int"},
        {"name": "failure_class", "type": _TEXT},
        {"name": "reason", "type": _TEXT},
        {"name": "actor", "type": "string"},
        {"name": "replay_id", "type": _TEXT},
        {"name": "correlation_id", "type": _TEXT},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "event_topic", "type": _TEXT},
        {"name": "event_partition", "type": ["null", "int"]},
        {"name": "event_offset", "type": ["null", "long"]},
    ],
}
SYNC_RECORDS = 4000  # records per Avro block


def _header(fh: BinaryIO) -> dict[str, Any]:
    """The container file's header (magic, metadata, sync marker), read with Avro's own header
    schema: the writer schema stays unparsed text."""
    header = fastavro.schemaless_reader(fh, HEADER_SCHEMA)
    if not isinstance(header, dict) or header.get("magic") != MAGIC:
        raise ValueError("not an Avro object container file")
    return header


class FileFormat:
    """One of the archive's file schemas: parsed once, with the writer schema its files' headers
    carry (a reader compares a header with it, never parses another as a schema)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.parsed = fastavro.parse_schema(schema)
        buffer = io.BytesIO()
        Writer(buffer, self.parsed).flush()
        buffer.seek(0)
        self.header_schema = json.loads(_header(buffer)["meta"]["avro.schema"])

    def wrote(self, header_text: object) -> bool:
        """Whether a file header's writer schema is this format's: compared as JSON (fastavro orders
        a schema's keys differently from one process to the next), never parsed as a schema."""
        try:
            return isinstance(header_text, bytes) and json.loads(header_text) == self.header_schema
        except (ValueError, RecursionError):
            return False


RECORDS = FileFormat(RECORD_SCHEMA)
TRANSITIONS = FileFormat(TRANSITION_SCHEMA)


class FileDamaged(Exception):
    """An archived file that is missing, or not the file its manifest entry describes; str(self)
    is one line saying which."""


@dataclass(frozen=True)
class SealedFile:
    """A spool file closed and synced: where it is, its SHA-256 and size."""

    path: Path
    sha256: str
    size: int


class Spool:
    """An open file of one segment, in a temporary file of `folder` until sealed."""

    def __init__(self, form: FileFormat, folder: Path, metadata: dict[str, str]) -> None:
        fd, name = tempfile.mkstemp(prefix="segment-", suffix=".avro", dir=folder)
        self.path = Path(name)
        self._file: BinaryIO = os.fdopen(fd, "w+b")
        self._writer = Writer(self._file, form.parsed, codec="deflate", sync_interval=SYNC_RECORDS,
                              metadata=metadata)

    def append(self, record: dict[str, Any]) -> None:
        self._writer.write(record)

    def seal(self) -> SealedFile:
        """Flush, sync and hash the file; the spool takes no more records."""
        self._writer.flush()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        digest, size = file_digest(self.path)
        return SealedFile(self.path, digest, size)

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)


def file_digest(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of the file at `path`."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def read_verified(path: Path | None, form: FileFormat, sha256: str | None, size: int,
                  where: str) -> Iterator[dict[str, Any]]:
    """The records of the file at `path` once its SHA-256 and size match the manifest's and its
    header names `form`'s schema; FileDamaged (before any record) otherwise."""
    if path is None:
        raise FileDamaged(f"{where}: missing")
    digest, found = file_digest(path)
    if (digest, found) != (sha256, size):
        raise FileDamaged(f"{where}: altered (its SHA-256 or size is not the manifest's)")
    with path.open("rb") as fh:
        try:
            written = _header(fh)["meta"].get("avro.schema")
        except Exception:  # whatever fastavro raises on bytes that are not a header
            raise FileDamaged(f"{where}: not an Avro object container file") from None
        if not form.wrote(written):
            raise FileDamaged(f"{where}: written with a schema this archive does not write")
        fh.seek(0)
        yield from fastavro.reader(fh)  # type: ignore[misc]
