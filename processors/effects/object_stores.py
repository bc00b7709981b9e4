"""The stores of `object-store` effects: the interface, key checks, a filesystem store, and a
faulty one for the demo (an S3-compatible store is in `s3_store`).

Every store's delete must be idempotent (delete-if-present): a lease that expired after the
effect but before its completion was recorded makes the next holder call delete again.
"""

from __future__ import annotations

import random
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


class FilesystemObjectStore:
    """Objects are files under `root`; keys are relative POSIX paths without `..`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.removed = 0  # deletes that really removed a file
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        key = object_key("", key)
        parts = PurePosixPath(key).parts
        if key.startswith("/") or ".." in parts:
            raise EffectFailure(INVALID, f"object key {key[:80]!r} is not a relative path")
        return self.root.joinpath(*parts)

    def put(self, key: str, data: bytes = b"") -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def delete(self, key: str) -> bool:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise EffectFailure(TEMPORARY, f"cannot delete {key[:80]!r}: {exc.strerror}") from None
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
