"""What runs one kind's external effect: a caller of `EffectCall`s, built once per kind.

A declared `http` effect gets an `HttpCaller`, a declared `object-store` effect an
`ObjectDeleter` over the store its URL names (the demo's fault injection wraps any store), and a
Python kind its own `ExternalEffect.call`. The caller raises `EffectFailure` (or anything that
`classify` sorts) on failure; what it returns is ignored.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

from lapse.kernel.kinds import CleanupKind
from lapse.kernel.kinds.effects import EffectCall, HttpEffect, ObjectStoreEffect
from lapse.kernel.settings import Settings
from lapse.processors.http_effect import HttpCaller
from lapse.processors.object_store import FaultyObjectStore, FilesystemObjectStore, ObjectStore, object_key
from lapse.processors.rules import external_effect

EffectCaller = Callable[[EffectCall], object]
CallerFactory = Callable[[CleanupKind], EffectCaller]


class ObjectDeleter:
    """Deletes the object a row's key column names (read into the call's target) from one store."""

    def __init__(self, store: ObjectStore, key_column: str) -> None:
        self.store = store
        self.key_column = key_column

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
            from lapse.processors.s3_store import S3ObjectStore
        except ImportError as exc:
            raise ValueError(f"an s3:// object store needs boto3 ({exc}): install lapse[s3]") from None

        bucket, _, prefix = effect.url.removeprefix("s3://").partition("/")
        return S3ObjectStore(bucket, prefix, endpoint_url=effect.endpoint_url, region=effect.region,
                             max_connections=max_connections)
    raise ValueError(f"object store URL {effect.url[:80]!r} is neither s3://bucket[/prefix] nor file:PATH")


def build_caller(kind: CleanupKind, *, concurrency: int = 8, fault_rate: float = 0.0,
                 rng: random.Random | None = None) -> EffectCaller:
    """The caller of `kind`'s external effect: its declaration's, else its own `call`.
    `fault_rate` > 0 makes an object store fail that share of deletes (the demo)."""
    effect = external_effect(kind)
    declared = effect.declared
    if isinstance(declared, HttpEffect):
        return HttpCaller(declared)
    if isinstance(declared, ObjectStoreEffect):
        store = open_store(declared, max_connections=concurrency)
        if fault_rate > 0:
            store = FaultyObjectStore(store, fault_rate, rng or random.Random())
        return ObjectDeleter(store, declared.key_column)
    if effect.call is not None:
        return effect.call
    raise TypeError(f"cleanup kind {kind.name!r} declares no external effect and brings no call")


def callers_from_settings(settings: Settings) -> CallerFactory:
    """The factory of the worker's callers: pool size and fault injection from settings."""
    return partial(build_caller, concurrency=settings.processor.effect_concurrency,
                   fault_rate=settings.dev.object_store_fault_rate)
