"""Object stores for the `artifact-delete` kind: the interface, a filesystem store, a faulty one.

Every store's delete must be idempotent (delete-if-present): a lease that expired after the
effect but before its completion was recorded makes the next holder call delete again.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path, PurePosixPath
from typing import Protocol

from lapse.processors.failures import INVALID, RATE_LIMITED, TEMPORARY, EffectFailure


class ObjectStore(Protocol):
    """What artifact-delete needs from a store.

    An S3-compatible store implements `delete` as DeleteObject (204 whether or not the key
    existed); an HTTP store as DELETE treating 404 as done. Either raises EffectFailure:
    RATE_LIMITED with the Retry-After seconds on 429/SlowDown, TEMPORARY on 5xx and connection
    errors, INVALID on 400/403 for a key that can never be deleted, AMBIGUOUS on a timeout after
    the request was sent.
    """

    def delete(self, key: str) -> bool:
        """Remove the object if present; True if it existed."""
        ...


class FilesystemObjectStore:
    """Objects are files under `root`; keys are relative POSIX paths without `..`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.removed = 0  # deletes that really removed a file
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        parts = PurePosixPath(key).parts
        if not key or key.startswith("/") or ".." in parts or "\0" in key:
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


class FaultyObjectStore:
    """Wraps a store and fails a share `rate` of deletes: mostly 429 with Retry-After, some 503,
    now and then an invalid key (for the demo's --fault-rate and for tests)."""

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


def store_from_settings(settings, rng: random.Random | None = None) -> ObjectStore:
    """The filesystem store at `object_store_dir`, faulty when `object_store_fault_rate` > 0."""
    store: ObjectStore = FilesystemObjectStore(settings.processor.object_store_dir)
    if settings.dev.object_store_fault_rate > 0:
        store = FaultyObjectStore(store, settings.dev.object_store_fault_rate, rng or random.Random())
    return store
