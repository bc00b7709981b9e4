"""The stores of `object-store` effects: the interface, key checks, a filesystem store, and a
faulty one for the demo (an S3-compatible store is in `s3_store`).

Every store's delete must be idempotent (delete-if-present): a lease that expired after the
effect but before its completion was recorded makes the next holder call delete again.
"""

from __future__ import annotations

import contextlib
import os
import random
import stat
import threading
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from lapse.kernel.text import one_line
from lapse.processors.failures import INVALID, RATE_LIMITED, TEMPORARY, EffectFailure

MAX_KEY_BYTES = 1024  # S3's limit on an object key, UTF-8 encoded


class ObjectStore(Protocol):
    """What an `object-store` effect needs from a store.

    `delete` removes the object if present and is done when it is absent. It raises EffectFailure:
    RATE_LIMITED (with the Retry-After seconds, if given) on 429/SlowDown, TEMPORARY on 5xx and
    on an endpoint not reached, INVALID for a key or request that can never succeed, AMBIGUOUS on
    a timeout after the request was sent.
    """

    def delete(self, key: str) -> bool:
        """Remove the object if present; True if the store removed one (S3 cannot tell: True)."""
        ...

    def close(self) -> None:
        """Release the store's connections, if it holds any."""
        ...


def object_key(prefix: str, value: Any) -> str:
    """The full key of the object named by a row's key column value under `prefix`, checked
    before any call: a non-empty string with no NUL, at most MAX_KEY_BYTES with the prefix."""
    if not isinstance(value, str) or not value:
        raise EffectFailure(INVALID, f"object key {one_line(repr(value), 80)} is not a non-empty string")
    key = prefix + value
    if "\0" in key:
        raise EffectFailure(INVALID, f"object key {one_line(repr(value), 80)} holds a NUL character")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise EffectFailure(INVALID, f"object key {one_line(repr(value), 80)} is longer than {MAX_KEY_BYTES} bytes")
    return key


class OutsideTheFolder(Exception):
    """A key whose path passes through a symbolic link: it could lead out of the store's folder."""


class FilesystemObjectStore:
    """Objects are files under `root`; keys are relative POSIX paths without `..`, walked one name
    at a time from the folder without following a symbolic link, so no key reaches outside it."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.removed = 0  # deletes that really removed a file
        self._lock = threading.Lock()

    def parts(self, key: str) -> tuple[str, ...]:
        key = object_key("", key)
        parts = PurePosixPath(key).parts
        if key.startswith("/") or ".." in parts:
            raise EffectFailure(INVALID, f"object key {key[:80]!r} is not a relative path")
        return parts

    def _folder(self, names: tuple[str, ...], *, create: bool = False) -> int:
        """A descriptor of the folder `names` under the root, opened name by name with O_NOFOLLOW
        (made where missing with `create`); OutsideTheFolder when one of them is a symbolic link."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name in names:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=fd)
                try:
                    inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except NotADirectoryError:  # a file, or a link O_NOFOLLOW would not follow
                    if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise OutsideTheFolder(name) from None
                    raise
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd

    def put(self, key: str, data: bytes = b"") -> None:
        *names, name = self.parts(key)
        self.root.mkdir(parents=True, exist_ok=True)
        folder = self._folder(tuple(names), create=True)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=folder)
        finally:
            os.close(folder)
        with os.fdopen(fd, "wb") as file:
            file.write(data)

    def exists(self, key: str) -> bool:
        *names, name = self.parts(key)
        try:
            folder = self._folder(tuple(names))
        except (FileNotFoundError, NotADirectoryError, OutsideTheFolder):
            return False
        try:
            os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return False
        finally:
            os.close(folder)
        return True

    def delete(self, key: str) -> bool:
        *names, name = self.parts(key)
        try:
            folder = self._folder(tuple(names))
        except (FileNotFoundError, NotADirectoryError):
            return False  # no such folder: the object is absent
        except OutsideTheFolder as link:
            raise EffectFailure(INVALID, f"object key {key[:80]!r} passes through the symbolic link "
                                         f"{str(link)[:80]!r}, which could lead out of the store's folder") from None
        except OSError as exc:
            raise EffectFailure(TEMPORARY, f"cannot delete {key[:80]!r}: {exc.strerror}") from None
        try:
            os.unlink(name, dir_fd=folder)  # a link itself is removed, never what it points to
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise EffectFailure(TEMPORARY, f"cannot delete {key[:80]!r}: {exc.strerror}") from None
        finally:
            os.close(folder)
        with self._lock:
            self.removed += 1
        return True

    def close(self) -> None:
        pass


class FaultyObjectStore:
    """Wraps a store and fails a share `rate` of deletes: mostly 429 with Retry-After, some 503,
    now and then an invalid key (for the demo's --fault-rate and for tests). The faults are the
    operation's own, not load: they neither slow down nor stop the kind's other calls."""

    def __init__(self, inner: ObjectStore, rate: float, rng: random.Random,
                 retry_after_s: float = 2.0) -> None:
        self.inner = inner
        self.rate = rate
        self.rng = rng
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()

    def delete(self, key: str) -> bool:
        with self._lock:
            roll, pick = self.rng.random(), self.rng.random()
        if roll < self.rate:
            if pick < 0.6:
                raise EffectFailure(RATE_LIMITED, "429 Too Many Requests", retry_after=self.retry_after_s)
            if pick < 0.95:
                raise EffectFailure(TEMPORARY, "503 Service Unavailable")
            raise EffectFailure(INVALID, f"400 invalid object key {key[:80]!r}")
        return self.inner.delete(key)

    def close(self) -> None:
        self.inner.close()
