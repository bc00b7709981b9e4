"""A token bucket: at most `rate` acquisitions per second on average, bursts up to `burst`.

Paces the reconciler's recovery traffic in one process. (External effects are paced for every
worker at once: `lapse.kernel.limits`.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Thread-safe; `acquire(n)` spends n tokens and sleeps off any debt (a request larger than
    the burst simply waits longer)."""

    def __init__(self, rate: float, burst: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.clock = clock
        self.sleep = sleep
        self.tokens = self.burst
        self.stamp = clock()
        self._lock = threading.Lock()

    def acquire(self, n: int = 1) -> None:
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate) - n
            self.stamp = now
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            self.sleep(wait)
