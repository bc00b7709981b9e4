"""Opening the store an archive URL names, and proving at start that it takes writes."""

from __future__ import annotations

import uuid
from pathlib import Path

from lapse.archive.locations import parse_archive_url
from lapse.archive.stores import ArchiveRefused, ArchiveStore, FolderStore
from lapse.kernel.settings import Settings

PROBE_KEY = "_lapse/writable-probe"  # written (overwritten) at start to prove the store takes writes


def open_store(url: str, settings: Settings) -> ArchiveStore:
    """The store `url` names (checked: ArchiveUrlError), with the archive settings' S3 endpoint and
    region; an s3:// URL without boto3 installed is refused (ArchiveRefused)."""
    checked = parse_archive_url(url)
    if checked.scheme == "file":
        return FolderStore(checked)
    try:  # boto3 is the optional `s3` extra: imported only for an s3:// archive
        from lapse.archive.s3_store import S3ArchiveStore
    except ImportError as exc:
        raise ArchiveRefused(f"an s3:// archive needs boto3 ({exc}): install lapse[s3]") from None
    return S3ArchiveStore(checked, endpoint_url=settings.archive.endpoint_url, region=settings.archive.region)


def check_writable(store: ArchiveStore, scratch: Path) -> None:
    """Write the probe object through a file in the folder `scratch` (ArchiveRefused or
    ArchiveUnavailable when the store will not take it)."""
    probe = scratch / f"probe-{uuid.uuid4().hex[:12]}"
    probe.write_bytes(b"lapse archive: this store takes writes\n")
    try:
        store.put_file(PROBE_KEY, probe)
    finally:
        probe.unlink(missing_ok=True)
