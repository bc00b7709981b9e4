"""Where the archive keeps things: its URL (`s3://bucket/prefix` or `file:///path`), checked where
it enters, and the keys of its files and manifest entries under that root.

A stream is a topic partition (`topics/<topic>/partition=<p>`) or the ledger's transitions table
(`tables/lapse_transitions`). Under a stream, data files sit in Hive-style hour folders named by
the time of their first record, each file named by the offsets it holds; the manifest is the
stream's `manifest/` folder, one entry per file, named by its first offset (zero-padded, so keys
sort as offsets do).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from lapse.kernel.text import UNSAFE, one_line

MAX_URL_CHARS = 1024
MAX_PREFIX_BYTES = 512  # leaves S3's 1,024-byte key limit room for the archive's own key names
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_STREAM_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
OFFSET_DIGITS = 20  # every offset and transaction id fits: 2**64 has 20 digits
TRANSITIONS = "lapse_transitions"  # the stream of the ledger's transitions


class ArchiveUrlError(ValueError):
    """The archive URL is malformed; str(self) is one line naming what is wrong."""


@dataclass(frozen=True)
class ArchiveUrl:
    """A checked archive URL: an S3 bucket and key prefix, or an absolute folder."""

    scheme: str  # "s3" | "file"
    bucket: str | None
    root: str  # s3: the key prefix ("" or ending in "/"); file: the absolute folder

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.root}".rstrip("/")
        return f"file://{self.root}"


def parse_archive_url(url: object) -> ArchiveUrl:
    """`url` checked: `s3://bucket[/prefix]` or `file:///absolute/path`; ArchiveUrlError otherwise."""
    if not isinstance(url, str) or not url:
        raise ArchiveUrlError("archive URL: give s3://bucket/prefix or file:///path")
    shown = one_line(url, 80)
    if len(url) > MAX_URL_CHARS or UNSAFE.search(url):
        raise ArchiveUrlError(f"archive URL {shown!r}: control characters or longer than {MAX_URL_CHARS}")
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise ArchiveUrlError(f"archive URL {shown!r}: no query or fragment allowed")
    if parts.scheme == "s3":
        bucket, prefix = parts.netloc, parts.path.strip("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ArchiveUrlError(f"archive URL {shown!r}: {bucket!r} is not an S3 bucket name")
        return ArchiveUrl("s3", bucket, _checked_prefix(prefix, shown))
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ArchiveUrlError(f"archive URL {shown!r}: a file URL names a folder on this host: file:///path")
        path = unquote(parts.path)
        if not path.startswith("/") or UNSAFE.search(path) or ".." in PurePosixPath(path).parts:
            raise ArchiveUrlError(f"archive URL {shown!r}: give an absolute folder, file:///path")
        return ArchiveUrl("file", None, str(PurePosixPath(path)))
    raise ArchiveUrlError(f"archive URL {shown!r}: give s3://bucket/prefix or file:///path")


def _checked_prefix(prefix: str, shown: str) -> str:
    segments = prefix.split("/") if prefix else []
    if any(s in ("", ".", "..") for s in segments) or len(prefix.encode()) > MAX_PREFIX_BYTES:
        raise ArchiveUrlError(f"archive URL {shown!r}: the prefix must be plain path segments, "
                              f"at most {MAX_PREFIX_BYTES} bytes")
    return prefix + "/" if prefix else ""


def topic_stream(topic: str, partition: int) -> str:
    """The stream of one topic partition."""
    if not _STREAM_NAME.fullmatch(topic) or partition < 0:
        raise ValueError(f"not a topic partition: {one_line(topic, 80)!r}[{partition}]")
    return f"topics/{topic}/partition={partition}"


def transitions_stream() -> str:
    return f"tables/{TRANSITIONS}"


def manifest_folder(stream: str) -> str:
    return f"{stream}/manifest/"


def entry_key(stream: str, first: int) -> str:
    """The manifest entry of the file whose first offset is `first`."""
    return f"{manifest_folder(stream)}{first:0{OFFSET_DIGITS}d}.json"


def data_key(stream: str, first: int, last: int, first_ms: int | None) -> str:
    """The data file of offsets [first, last], in the hour folder of its first record's time."""
    at = datetime.fromtimestamp((first_ms or 0) / 1000, UTC)
    return (f"{stream}/date={at:%Y-%m-%d}/hour={at:%H}/"
            f"{first:0{OFFSET_DIGITS}d}-{last:0{OFFSET_DIGITS}d}.avro")
