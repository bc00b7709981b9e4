"""The figures behind the console's charts, over the last hour (one-minute buckets) and the last
day (half-hour buckets).

What the database keeps is read from it: transitions per bucket along ix_lapse_transitions_at give
the throughput by outcome, the dead letters made, and (counted back from the number waiting now)
the dead letters waiting at the end of each bucket. A closed bucket never changes, so it is read
once and kept; a render reads only the buckets still open (the last minute or two). What only
exists now (the oldest eligible age, the lag of each consumer group) is sampled by this process:
by every overview it renders and, between them, every `every_s` seconds on a thread, kept for a day.
Those two series begin when the console starts."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from lapse.kernel.logs import get_logger
from lapse.kernel.outages import is_transient
from lapse.kernel.settings import Settings
from lapse.readers import transition_buckets
from lapse.shell.console import views
from lapse.shell.console.outages import Outages

log = get_logger("console")
SAMPLE_EVERY_S = 30.0
# The closest two kept samples may be (overviews in several tabs sample too): a day is at most
# 8,641 samples, whoever looks.
MIN_GAP = timedelta(seconds=10)
# A bucket is read once for good when it ended this long ago (a transaction may commit a little
# after the time its transitions carry).
SETTLED_AFTER = timedelta(seconds=60)
OUTCOMES = ("applied", "skipped", "retry_scheduled", "dead_letter")
MINUTE = 60


def _at(epoch_s: int, like: datetime) -> datetime:
    return datetime.fromtimestamp(epoch_s, like.tzinfo)


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for state, n in one.items():
            total[state] = total.get(state, 0) + n
    return total


@dataclass(frozen=True)
class Window:
    """A chart's span and bucket size."""

    name: str
    span: timedelta
    step_s: int

    @property
    def buckets(self) -> int:
        return int(self.span.total_seconds()) // self.step_s


WINDOWS = {"hour": Window("hour", timedelta(hours=1), MINUTE), "day": Window("day", timedelta(days=1), 1800)}


@dataclass(frozen=True)
class Sample:
    """What the console saw at `at`: the oldest eligible age (None: nothing eligible) and the
    records behind per judged consumer group."""

    at: datetime
    oldest_eligible_age_s: float | None
    lag: dict[str, int]


class Samples:
    """The chart figures: kept transition buckets, the gauge samples, and the sampling thread."""

    def __init__(self, settings: Settings, engine: Engine, outages: Outages, every_s: float | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.outages = outages
        self.every_s = SAMPLE_EVERY_S if every_s is None else every_s
        self.kept: dict[int, dict[int, dict[str, int]]] = {w.step_s: {} for w in WINDOWS.values()}
        self.gauges: deque[Sample] = deque(maxlen=int(WINDOWS["day"].span / MIN_GAP) + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_sample = 0.0

    # Gauges ------------------------------------------------------------------------------------

    def record(self, report: dict[str, Any], now: datetime) -> None:
        """Keep what a status report (with its lag rows marked `judged`) says now, unless a sample
        was kept less than MIN_GAP before."""
        lag: dict[str, int] = {}
        for row in report.get("lag", []):
            if row.get("judged") and "records" in row:
                lag[row["group"]] = lag.get(row["group"], 0) + row["records"]
        with self._lock:
            if self.gauges and now - self.gauges[-1].at < MIN_GAP:
                return
            self.gauges.append(Sample(now, report.get("oldest_eligible_age_s"), lag))
            self.last_sample = time.monotonic()

    def gauge_series(self, window: Window, now: datetime) -> list[Sample]:
        with self._lock:
            return [s for s in self.gauges if s.at > now - window.span]

    # Transitions ---------------------------------------------------------------------------------

    def buckets(self, window: Window, now: datetime) -> list[tuple[datetime, dict[str, int]]]:
        """(bucket start, counts) for each bucket of `window` up to `now`, oldest first: the settled
        ones read once (in one statement) and kept; the open ones (the last minute or two) read now,
        a wider window's summed from the hour's minutes."""
        step = window.step_s
        last = int(now.timestamp()) // step * step
        starts = [last - i * step for i in range(window.buckets - 1, -1, -1)]
        settled_before = (now - SETTLED_AFTER).timestamp()
        with self._lock:
            kept = self.kept[step]
            for old in [b for b in kept if b < starts[0]]:
                del kept[old]
            missing = [b for b in starts if b not in kept and b + step <= settled_before]
        if missing:
            with self.engine.connect() as conn:
                read = transition_buckets(conn, _at(missing[0], now), _at(missing[-1] + step, now), step)
            with self._lock:
                kept.update({b: read.get(b, {}) for b in missing})
        open_starts = [b for b in starts if b + step > settled_before]
        if step == MINUTE:
            with self.engine.connect() as conn:
                fresh = transition_buckets(conn, _at(open_starts[0], now), now, step)
        else:
            minutes = {int(at.timestamp()): counts for at, counts in self.buckets(WINDOWS["hour"], now)}
            fresh = {b: _summed(c for m, c in minutes.items() if b <= m < b + step) for b in open_starts}
        with self._lock:
            return [(_at(b, now), kept.get(b) or fresh.get(b, {})) for b in starts]

    # The thread --------------------------------------------------------------------------------

    def start(self) -> None:
        """Sample on a thread every `every_s` seconds (0: only when an overview is rendered)."""
        if self.every_s <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="console-samples", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self.last_sample >= self.every_s * 0.9:
                try:
                    now = views.now_utc()
                    report = views.overview_report(self.settings, self.engine, now)
                    self.record(report, now)
                    for window in WINDOWS.values():
                        self.buckets(window, now)
                    self.outages.up("database")
                except Exception as exc:
                    if not is_transient(exc):
                        log.error("console: a chart sample failed", exc_info=exc)
                    else:
                        self.outages.down("database", views.error_line(exc, self.settings))
            self._stop.wait(self.every_s)


__all__ = ["OUTCOMES", "SAMPLE_EVERY_S", "WINDOWS", "Sample", "Samples", "Window"]
