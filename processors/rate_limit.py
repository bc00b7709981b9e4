"""A token bucket: at most `rate` acquisitions per second on average, bursts up to `burst`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Thread-safe; `acquire` waits (via `sleep`) until a token is available."""

    def __init__(self, rate: float, burst: float | None = None,
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

    def _wait_needed(self) -> float:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate

    def acquire(self) -> None:
        while True:
            with self._lock:
                wait = self._wait_needed()
            if wait == 0.0:
                return
            self.sleep(wait)
