"""What runs one kind's external effect: a caller of `EffectCall`s, built once per kind.

A declared effect's caller is built by the builder its type registers in
`processors/effects` (keyed by the type's tag); a Python kind brings its own
`ExternalEffect.call`. The caller raises `EffectFailure` (or anything that `classify` sorts) on
failure; what it returns is ignored.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

from lapse.kernel.kinds import CleanupKind
from lapse.kernel.settings import Settings
from lapse.processors.effects import BUILDERS, CallerSetup, EffectCaller
from lapse.processors.effects import python as python_effect
from lapse.processors.effects.object_store import ObjectDeleter, open_store
from lapse.processors.rules import external_effect

CallerFactory = Callable[[CleanupKind], EffectCaller]

__all__ = ["CallerFactory", "EffectCaller", "ObjectDeleter", "build_caller", "callers_from_settings", "open_store"]


def build_caller(kind: CleanupKind, *, concurrency: int = 8, fault_rate: float = 0.0,
                 rng: random.Random | None = None, settings: Settings | None = None) -> EffectCaller:
    """The caller of `kind`'s external effect: its declaration's, else its own `call`.
    `fault_rate` > 0 makes an object store fail that share of deletes (the demo); `settings`
    are the worker's (an effect that connects to Kafka needs them)."""
    effect = external_effect(kind)
    if effect.declared is None:
        return python_effect.build(kind, effect)
    tag = getattr(effect.declared, "tag", None)
    builder = BUILDERS.get(tag) if isinstance(tag, str) else None
    if builder is None:
        raise TypeError(f"no caller is registered for the effect {tag!r} of cleanup kind {kind.name!r}")
    return builder(effect.declared, CallerSetup(settings, concurrency, fault_rate, rng or random.Random()))


def callers_from_settings(settings: Settings) -> CallerFactory:
    """The factory of the worker's callers: pool size and fault injection from settings."""
    return partial(build_caller, concurrency=settings.processor.effect_concurrency,
                   fault_rate=settings.dev.object_store_fault_rate, settings=settings)
