"""The archive's stores: what the archive needs of one (put a file, create an object only if it is
absent, read, list in key order), and a folder (an S3-compatible store is in `s3_store`; `opening`
opens the one a URL names).

`put_file` returns once the file is durable: a folder's file is written under a temporary name,
fsynced and renamed over the final one (and the folder fsynced); an S3 object exists whole or not
at all. `create` is the manifest's commit point: it writes only if nothing has that key yet
(a folder: a hard link, which fails when the name exists; S3: `If-None-Match: *`), so two writers
of one entry cannot both win.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from lapse.archive.locations import ArchiveUrl

_TEMPORARY = ".tmp-"


class ArchiveRefused(Exception):
    """The store refuses the archive (no such bucket or folder, access denied, no credentials):
    not worth retrying. str(self) is one line."""


class ArchiveUnavailable(ConnectionError):
    """The store did not answer, or answered that it is busy: worth retrying later."""


class ArchiveStore(Protocol):
    """What the archive needs of a store; keys are relative, '/'-separated."""

    url: ArchiveUrl

    def put_file(self, key: str, path: Path) -> None:
        """Store the file at `path` under `key` (replacing any object there), durable on return."""
        ...

    def create(self, key: str, data: bytes) -> bool:
        """Store `data` under `key` only if nothing is there; False when something was."""
        ...

    def read(self, key: str) -> bytes | None:
        """The object under `key`, None when there is none."""
        ...

    def fetch(self, key: str, dest: Path) -> Path | None:
        """A local file holding the object under `key` (`dest`, or the object itself when the
        store is a folder), None when there is none."""
        ...

    def keys(self, folder: str, start_after: str | None = None) -> Iterator[str]:
        """The keys under `folder` (ending in '/') in key order, after `start_after` if given."""
        ...

    def close(self) -> None:
        ...


class FolderStore:
    """An archive in a folder of this machine (or a mounted file system)."""

    def __init__(self, url: ArchiveUrl) -> None:
        self.url = url
        self.root = Path(url.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _temporary(self, final: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        return final.with_name(f"{final.name}{_TEMPORARY}{uuid.uuid4().hex[:12]}")

    def put_file(self, key: str, path: Path) -> None:
        final = self._path(key)
        with _refusals(final):
            tmp = self._temporary(final)
            try:
                with path.open("rb") as src, tmp.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                    _sync(dst.fileno())
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
            _sync_folder(final.parent)

    def create(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        with _refusals(final):
            tmp = self._temporary(final)
            try:
                with tmp.open("wb") as dst:
                    dst.write(data)
                    _sync(dst.fileno())
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    return False
            finally:
                tmp.unlink(missing_ok=True)
            _sync_folder(final.parent)
            return True

    def read(self, key: str) -> bytes | None:
        path = self._path(key)
        with _refusals(path):
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None

    def fetch(self, key: str, dest: Path) -> Path | None:
        path = self._path(key)
        return path if path.is_file() else None

    def keys(self, folder: str, start_after: str | None = None) -> Iterator[str]:
        base = self._path(folder.rstrip("/"))
        with _refusals(base):
            found = sorted(f"{folder}{p.relative_to(base).as_posix()}" for p in base.rglob("*")
                           if p.is_file() and _TEMPORARY not in p.name) if base.is_dir() else []
        yield from (k for k in found if start_after is None or k > start_after)

    def close(self) -> None:
        return None


@contextlib.contextmanager
def _refusals(path: Path) -> Iterator[None]:
    """A folder that cannot be written or read is a refusal, in one line."""
    try:
        yield
    except (PermissionError, NotADirectoryError, IsADirectoryError, FileExistsError) as exc:
        raise ArchiveRefused(f"archive folder: {exc.strerror or type(exc).__name__}: {exc.filename or path}") from None
    except OSError as exc:
        if exc.errno is not None and exc.strerror:
            raise ArchiveRefused(f"archive folder: {exc.strerror}: {exc.filename or path}") from None
        raise


def _sync(fd: int) -> None:
    os.fsync(fd)


def _sync_folder(folder: Path) -> None:
    """Make a rename or link in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
