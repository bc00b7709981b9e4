"""The callers of external effects, one module per effect type (object-store's stores beside it in
`object_stores` and `s3_store`), registered by the type's tag.

A builder gets the kind's compiled declaration (`ExternalEffect.declared`) and the worker's
`CallerSetup` and returns the caller of the kind's `EffectCall`s: it raises `EffectFailure` (or
anything `failures.classify` sorts) on failure; what it returns is ignored; a `close()` it has is
called when the worker stops. A Python kind brings its own call (`python`).
"""

from __future__ import annotations

from lapse.processors.effects import http, kafka_produce, object_store
from lapse.processors.effects.base import Builder, CallerSetup, EffectCaller

# Register an effect type's caller here, under its tag (its declaration: lapse.kernel.kinds.effects).
BUILDERS: dict[str, Builder] = {
    "http": http.build,
    "object-store": object_store.build,
    "kafka-produce": kafka_produce.build,
}

__all__ = ["BUILDERS", "Builder", "CallerSetup", "EffectCaller"]
