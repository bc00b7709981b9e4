"""The dead-letter circuit: stop feeding a partition to a deploy that is failing everything.

When, among a partition's last `window` outcomes, the share that failed (dead letters, temporary
failures, poison) reaches `threshold` — and at least `min_events` were seen — the worker pauses the
partition for `cooldown_s` and logs an alert. The records stay in Kafka, uncommitted and unharmed;
after the cooldown the partition resumes, and trips again at once if nothing was fixed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CircuitPolicy:
    threshold: float = 0.5
    min_events: int = 20
    window: int = 200
    cooldown_s: float = 60.0


@dataclass
class DeadLetterCircuit:
    """Per-partition sliding windows of outcomes and the partitions currently held open."""

    policy: CircuitPolicy
    clock: Callable[[], float] = time.monotonic
    _windows: dict[tuple[str, int], deque] = field(default_factory=dict)
    _open_until: dict[tuple[str, int], float] = field(default_factory=dict)

    def record(self, tp: tuple[str, int], good: int, bad: int) -> bool:
        """Add a batch's outcomes for `tp`; True when this trips the circuit open."""
        window = self._windows.setdefault(tp, deque(maxlen=self.policy.window))
        window.extend([False] * good + [True] * bad)
        failed = sum(window)
        if len(window) >= self.policy.min_events and failed / len(window) >= self.policy.threshold:
            self._open_until[tp] = self.clock() + self.policy.cooldown_s
            window.clear()
            return True
        return False

    def share_failed(self, tp: tuple[str, int]) -> float:
        window = self._windows.get(tp) or ()
        return sum(window) / len(window) if window else 0.0

    def due_to_close(self) -> list[tuple[str, int]]:
        """Partitions whose cooldown has passed; they are forgotten as open."""
        now = self.clock()
        ready = [tp for tp, until in self._open_until.items() if until <= now]
        for tp in ready:
            del self._open_until[tp]
        return ready

    def is_open(self, tp: tuple[str, int]) -> bool:
        return tp in self._open_until

    def forget(self, tps) -> None:
        """Drop state for revoked partitions: their next owner starts fresh."""
        for tp in tps:
            self._windows.pop(tp, None)
            self._open_until.pop(tp, None)
