"""A token bucket that paces re-emitted events, so recovery traffic cannot swamp the workers."""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; `take(n)` waits until n are paid for."""

    def __init__(self, rate: float, burst: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else rate
        self.clock = clock
        self.sleep = sleep
        self.tokens = self.burst
        self.last = clock()
        self.waited = 0.0

    def take(self, n: int) -> None:
        """Spend n tokens, sleeping off any debt (a page larger than the burst simply waits longer)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        if self.tokens < 0:
            wait = -self.tokens / self.rate
            self.waited += wait
            self.sleep(wait)
            self.tokens = 0.0
            self.last = self.clock()
