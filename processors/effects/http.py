"""The caller of a declared `http` effect: an `HttpCaller` (processors/http_effect) per kind."""

from __future__ import annotations

from lapse.kernel.kinds.effects import HttpEffect
from lapse.processors.effects.base import CallerSetup
from lapse.processors.http_effect import HttpCaller


def build(declared: HttpEffect, setup: CallerSetup) -> HttpCaller:
    return HttpCaller(declared)
