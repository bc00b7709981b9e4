"""The caller of a Python kind's external effect: the kind's own `ExternalEffect.call`."""

from __future__ import annotations

from lapse.kernel.kinds import CleanupKind, ExternalEffect
from lapse.processors.effects.base import EffectCaller


def build(kind: CleanupKind, effect: ExternalEffect) -> EffectCaller:
    if effect.call is None:
        raise TypeError(f"cleanup kind {kind.name!r} declares no external effect and brings no call")
    return effect.call
