"""The watch on a process's wall clock: where a wall clock is read outside the database (the delay
worker's release times, the console's displays), how far it is from the database's is measured
every `runtime.clock_check_interval_s`, shown as the `lapse_clock_skew_seconds` gauge and as the
role's `clock` finding (`lapse status`), and warned about at most every few minutes while it
exceeds `runtime.clock_skew_bound_s`. See docs/design/clock.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from prometheus_client import Gauge
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from lapse.kernel.clock import database_now, measure_skew
from lapse.kernel.findings import CLOCK, Finding, forget_findings, record_finding
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings

SKEW = Gauge("lapse_clock_skew_seconds", "How far this process's wall clock is ahead of the database's "
             "(negative: behind), as last measured.", ["role"], multiprocess_mode="liveall")
WARN_EVERY_S = 300.0  # while the skew exceeds its bound, one warning line this often
FORGET_AFTER = timedelta(days=1)  # a clock finding not renewed this long is a process gone
log = get_logger("clock")


class ClockWatch:
    """Measures this process's skew against the database on `engine()` (made on first use):
    `measure` once, or `start` a thread measuring until stopped. `now` is the wall clock corrected
    by the last skew measured (the wall clock itself until one was)."""

    def __init__(self, settings: Settings, role: str, engine: Callable[[], Engine]) -> None:
        self.role = role
        self.worker = settings.runtime.worker_id
        self.bound_s = settings.runtime.clock_skew_bound_s
        self.interval_s = settings.runtime.clock_check_interval_s
        self.engine = engine
        self.skew_s: float | None = None
        self._warned_at: float | None = None  # monotonic time of the last warning

    def now(self) -> datetime:
        """The database's time as this process best knows it without asking."""
        return datetime.now(UTC) - timedelta(seconds=self.skew_s or 0.0)

    def measure(self) -> float | None:
        """Measure the skew, keep it (gauge, finding, a warning when past the bound); None when the
        database could not be asked (the last skew measured stays)."""
        try:
            with self.engine().begin() as conn:
                skew = measure_skew(conn)
                at = database_now(conn)
                forget_findings(conn, CLOCK, at - FORGET_AFTER)
                record_finding(conn, Finding(
                    CLOCK, f"{self.role} {self.worker}"[:300], at, f"{skew:+.3f}s against the database",
                    {"role": self.role, "worker": self.worker, "skew_s": round(skew, 3), "bound_s": self.bound_s}))
        except SQLAlchemyError as exc:
            log.debug("clock skew not measured", extra={"role": self.role, "error": type(exc).__name__})
            return None
        self.skew_s = skew
        SKEW.labels(role=self.role).set(skew)
        self._warn_if_far(skew)
        return skew

    def _warn_if_far(self, skew: float) -> None:
        if abs(skew) <= self.bound_s:
            self._warned_at = None
            return
        if self._warned_at is not None and time.monotonic() - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = time.monotonic()
        log.warning("this machine's clock is %+.1fs from the database's (bound %gs): fix its time "
                    "synchronisation; decisions about time are the database's, but this process's "
                    "logs and displays are off", skew, self.bound_s,
                    extra={"role": self.role, "worker": self.worker, "skew_s": round(skew, 3)})

    def start(self, stop: threading.Event) -> threading.Thread:
        """Measure now and then every interval on a daemon thread, until `stop` is set."""
        def loop() -> None:
            while not stop.is_set():
                try:
                    self.measure()
                except Exception:  # a watch never stops the role it watches
                    log.exception("clock skew not measured", extra={"role": self.role})
                stop.wait(self.interval_s)

        thread = threading.Thread(target=loop, name=f"clock-{self.role}", daemon=True)
        thread.start()
        return thread
