"""The declarable effect types, one module each, and the one call an external effect receives.

base          what an effect type is (`EffectType`, `ExternalEffectType`) and what it compiles against
update        set columns of the due rows            delete        delete the due rows
http          call an HTTP endpoint                  object_store  delete one object from a store
python        a kind written in Python
registry      the one list of types, and `effect:` as a discriminated union over it

An effect type is a pydantic model that checks itself against the reflected table (`compile`) and
says which privileges its table needs; the processors build each external type's caller in
`processors/effects`. Every call carries the op key (a stable idempotency key) and the attempt,
so the far side can de-duplicate a call repeated after a lease takeover.
"""

from lapse.kernel.kinds.effects.http import HttpEffect
from lapse.kernel.kinds.effects.object_store import ObjectStoreEffect
from lapse.kernel.kinds.kind import EffectCall

__all__ = ["EffectCall", "HttpEffect", "ObjectStoreEffect"]
