"""The declarable effect types, one module each (update, delete, http, object_store,
kafka_produce, …; python for a kind written in Python), and the one call an external effect
receives. `base` says what an effect type is (`EffectType`, `ExternalEffectType`) and what it
compiles against; `registry` is the one list of types, and `effect:` as a discriminated union.

An effect type is a pydantic model that checks itself against the reflected table (`compile`) and
says which privileges its table needs; the processors build each external type's caller in
`processors/effects`. Every call carries the op key (a stable idempotency key) and the attempt,
so the far side can de-duplicate a call repeated after a lease takeover.
"""

from lapse.kernel.kinds.effects.http import HttpEffect, fill_url
from lapse.kernel.kinds.effects.object_store import ObjectStoreEffect
from lapse.kernel.kinds.kind import EffectCall

__all__ = ["EffectCall", "HttpEffect", "ObjectStoreEffect", "fill_url"]
