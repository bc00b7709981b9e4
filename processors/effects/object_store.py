"""The caller of a declared `object-store` effect: an `ObjectDeleter` over the store its URL names
(the demo's fault injection wraps any store)."""

from __future__ import annotations

from lapse.kernel.kinds.effects import EffectCall, ObjectStoreEffect
from lapse.processors.effects.base import CallerSetup
from lapse.processors.effects.object_stores import FaultyObjectStore, FilesystemObjectStore, ObjectStore, object_key


class ObjectDeleter:
    """Deletes the object a row's key column names (read into the call's target) from one store."""

    def __init__(self, store: ObjectStore, key_column: str, bucket: str = "") -> None:
        self.store = store
        self.key_column = key_column
        self.bucket = bucket

    def endpoint(self, call: EffectCall) -> str:
        """The bucket (or folder) every call of the kind goes to."""
        return self.bucket

    def __call__(self, call: EffectCall) -> None:
        self.store.delete(object_key("", call.target.get(self.key_column)))

    def close(self) -> None:
        self.store.close()


def open_store(effect: ObjectStoreEffect, *, max_connections: int = 10) -> ObjectStore:
    """The store an `object-store` declaration names: `s3://bucket[/prefix]` (boto3) or
    `file:PATH` (a folder; a relative path arrives already resolved against the kinds file)."""
    if effect.url.startswith("file:"):  # a path as written, not URL-encoded (as the kinds compiler reads it)
        folder = effect.url.removeprefix("file:")
        folder = folder[2:] if folder.startswith("//") else folder
        if folder:
            return FilesystemObjectStore(folder)
    if effect.url.startswith("s3://"):
        try:  # boto3 is the optional `s3` extra: imported only when a kind declares an S3 store
            from lapse.processors.effects.s3_store import S3ObjectStore
        except ImportError as exc:
            raise ValueError(f"an s3:// object store needs boto3 ({exc}): install lapse[s3]") from None

        bucket, _, prefix = effect.url.removeprefix("s3://").partition("/")
        return S3ObjectStore(bucket, prefix, endpoint_url=effect.endpoint_url, region=effect.region,
                             max_connections=max_connections)
    raise ValueError(f"object store URL {effect.url[:80]!r} is neither s3://bucket[/prefix] nor file:PATH")


def build(declared: ObjectStoreEffect, setup: CallerSetup) -> ObjectDeleter:
    store = open_store(declared, max_connections=setup.concurrency)
    if setup.fault_rate > 0:
        store = FaultyObjectStore(store, setup.fault_rate, setup.rng)
    return ObjectDeleter(store, declared.key_column, bucket_of(declared.url))


def bucket_of(url: str) -> str:
    """The bucket of `s3://bucket/prefix`, the folder of `file:PATH`: what the store's calls go to."""
    if url.startswith("s3://"):
        return url.removeprefix("s3://").partition("/")[0]
    return url[:300]
