"""What a caller builder gets and gives: the worker's setup, and a callable of `EffectCall`s."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.settings import Settings

EffectCaller = Callable[[EffectCall], object]


@dataclass(frozen=True)
class CallerSetup:
    """What the worker gives every builder: its settings (None in tests that need none), the
    effect pool's size, and the demo's fault injection."""

    settings: Settings | None = None
    concurrency: int = 8
    fault_rate: float = 0.0
    rng: random.Random = field(default_factory=random.Random)


Builder = Callable[[Any, CallerSetup], EffectCaller]


def endpoint_of(caller: EffectCaller, call: EffectCall) -> str:
    """Where `call` goes (an HTTP host and port, a bucket, a topic), for its limits and metrics: the
    caller's `endpoint(call)` when it has one, else '' (a Python kind's own effect)."""
    endpoint = getattr(caller, "endpoint", None)
    return str(endpoint(call)) if callable(endpoint) else ""
