"""A worker's side of the call limits shared by every worker (docs/design/limits.md).

Before each call of an external effect, its route's gate gives it a concurrency slot (when the kind
declares a concurrency) and a call slot at the route's rate, both leased from the database, where
every worker takes them; a call that gets none before its deadline is not made (rate-limited: it
backs off and comes again). After the call, what the far side said about the route (a 429, a
Retry-After) is written there for every worker, and what the calls saw is counted for status and
the metrics.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, Engine

from lapse.kernel.clock import database_clock
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.kinds.limits import Limits
from lapse.kernel.limits import (
    EndpointStats,
    RouteKey,
    acquire_slots,
    ensure_route,
    grant,
    release_slots,
    renew_slots,
    route_key,
    slow_down,
    without_flush,
    write_stats,
)
from lapse.kernel.logs import get_logger
from lapse.processors.failures import RATE_LIMITED, EffectFailure, classify
from lapse.processors.metrics import observe_call, observe_in_flight

log = get_logger("limits")

POLL_S = 0.1  # how often a worker waiting for a concurrency slot asks again (jittered)
HOLD_S = 1.0  # a concurrency slot kept busy this long goes back to the database, for other workers
STATS_EVERY_S = 5.0  # how often a worker writes what it saw, while it calls
WINDOW_S = 60  # what the stats cover: the last minute, in one-second buckets


@dataclass
class Ticket:
    """A call let through: its gate, endpoint, the database time its call slot was granted at (a
    429 to it lowers the rate only if the rate was not lowered since), the concurrency slot it
    holds, how long it waited, when it started."""

    gate: Gate
    endpoint: str
    paced_at: datetime
    slot: int | None
    waited_s: float
    started: float = field(default_factory=time.monotonic)


class Gate:
    """One route in one worker: call slots granted ahead (at most the route's horizon) and the
    concurrency slots this worker holds."""

    def __init__(self, limiter: Limiter, key: RouteKey, limits: Limits) -> None:
        self.limiter = limiter
        self.key = key
        self.limits = limits
        self.grant_lock = threading.Lock()  # one grant request at a time; the others wait for it
        self.booked: deque[tuple[float, datetime]] = deque()  # (monotonic start, database time granted)
        self.waiting_rate = 0
        self.cond = threading.Condition()
        self.free: list[int] = []
        self.held: dict[int, float] = {}  # concurrency slot → monotonic time it was taken
        self.waiting_slot = 0
        self.acquiring = False

    # -- the call slot, at the route's rate ---------------------------------------------------

    def _call_slot(self, deadline: float) -> tuple[float, datetime]:
        with self.cond:
            self.waiting_rate += 1
        try:
            with self.grant_lock:
                while not self.booked:
                    if time.monotonic() >= deadline:
                        raise self._not_started()
                    self._book(deadline)
                return self.booked.popleft()
        finally:
            with self.cond:
                self.waiting_rate -= 1

    def _book(self, deadline: float) -> None:
        """Ask the database for as many call slots as calls wait here. None (the route blocked, or
        booked ahead by other workers): sleep until it says to ask again, at most a second; a
        Retry-After that outlasts the deadline defers the call until it ends."""
        with self.limiter.begin() as conn:
            got = grant(conn, self.key, max(1, self.waiting_rate))
        ref = time.monotonic()  # the grant's database time, as this worker's monotonic clock reads it
        for slot in got.slots:
            self.booked.append((ref + (slot - got.at).total_seconds(), got.at))
        if got.slots or got.wait_until is None:
            return
        wait = max(0.0, (got.wait_until - got.at).total_seconds())
        if got.blocked_until is not None and ref + wait > deadline:
            raise EffectFailure(RATE_LIMITED, f"not started: {self.key.label()} is stopped by a Retry-After",
                                retry_after=(got.blocked_until - got.at).total_seconds())
        time.sleep(min(wait, 1.0))

    # -- the concurrency slot -----------------------------------------------------------------

    def _concurrency_slot(self, deadline: float) -> int | None:
        concurrency = self.limits.concurrency
        if not concurrency:
            return None
        with self.cond:
            self.waiting_slot += 1
            try:
                while True:
                    if self.free:
                        return self.free.pop()
                    if time.monotonic() >= deadline:
                        raise self._not_started()
                    want = min(self.waiting_slot, concurrency - len(self.held))
                    if want > 0 and not self.acquiring:
                        self.acquiring = True
                        self.cond.release()
                        try:
                            with self.limiter.begin() as conn:
                                got = acquire_slots(conn, self.key, self.limiter.worker, want, concurrency,
                                                    self.limiter.lease_s)
                        finally:
                            self.cond.acquire()
                            self.acquiring = False
                        now = time.monotonic()
                        self.held.update(dict.fromkeys(got, now))
                        self.free.extend(got)
                        if got:
                            self.cond.notify_all()
                            continue
                    self.cond.wait(timeout=POLL_S * random.uniform(0.5, 1.5))
            finally:
                self.waiting_slot -= 1

    def _give_back(self, slot: int | None) -> None:
        """Keep the slot for this worker's next call (`release_idle` gives it back when the calls of a
        run are done), unless it has been held for HOLD_S: then it goes back to the database, so
        other workers' calls get their turn."""
        if slot is None:
            return
        with self.cond:
            if time.monotonic() - self.held[slot] < HOLD_S:
                self.free.append(slot)
                self.cond.notify()
                return
            del self.held[slot]
        with self.limiter.begin() as conn:
            release_slots(conn, self.key, self.limiter.worker, [slot])

    def release_idle(self) -> None:
        """Give back the slots no call of this worker uses now."""
        with self.cond:
            slots, self.free = self.free, []
            for slot in slots:
                del self.held[slot]
        if slots:
            with self.limiter.begin() as conn:
                release_slots(conn, self.key, self.limiter.worker, slots)

    def _not_started(self) -> EffectFailure:
        return EffectFailure(RATE_LIMITED, f"not started: no call slot of {self.key.label()} came free "
                                           "before the lease would have run out")

    # -- a call ---------------------------------------------------------------------------------

    def admit(self, endpoint: str, deadline: float) -> Ticket:
        """Wait for a concurrency slot, then a call slot, then the slot's time; raises a
        rate-limited EffectFailure if none came before `deadline` (monotonic)."""
        began = time.monotonic()
        slot = self._concurrency_slot(deadline)
        try:
            start, paced_at = self._call_slot(deadline)
        except BaseException:
            self._give_back(slot)
            raise
        if start > deadline:
            self._give_back(slot)
            raise self._not_started()
        time.sleep(max(0.0, start - time.monotonic()))
        self.limiter.in_flight(self.key.kind, endpoint, +1)
        return Ticket(self, endpoint, paced_at, slot, time.monotonic() - began)

    def finish(self, ticket: Ticket, error: BaseException | None, *, called: bool = True) -> None:
        """After the call: tell every worker what the far side said about the route, count it, and
        give the concurrency slot back. `called=False`: the call was not made after all (paused)."""
        self.limiter.in_flight(self.key.kind, ticket.endpoint, -1)
        try:
            failure = classify(error) if error is not None and called else None
            if failure is not None and (failure.slow_down or failure.stop_route):
                self._slow_down(ticket, failure)
            if called:
                self.limiter.count(self.key.kind, ticket.endpoint, failure, ticket.waited_s,
                                   time.monotonic() - ticket.started)
        finally:
            self._give_back(ticket.slot)

    def _slow_down(self, ticket: Ticket, failure: EffectFailure) -> None:
        with self.limiter.begin() as conn:
            now = database_clock(conn)
            block_s = failure.wait_s(now) if failure.stop_route else None
            slow_down(conn, self.key, now, paced_at=ticket.paced_at if failure.slow_down else None,
                      block_s=block_s)
        if block_s:
            with self.grant_lock:  # slots booked before the block are not used: ask again, and wait
                self.booked.clear()
        log.info("far side slowed the route down", extra={
            "kind": self.key.kind, "route": self.key.route, "endpoint": ticket.endpoint,
            "retry_after_s": block_s, "lowered": failure.slow_down})

    def renew(self) -> None:
        """Extend the leases of the concurrency slots this worker holds (calls longer than a lease)."""
        with self.cond:
            slots = list(self.held)
        if slots:
            with self.limiter.begin() as conn:
                kept = renew_slots(conn, self.key, self.limiter.worker, slots, self.limiter.lease_s)
            lost = set(slots) - kept
            if lost:
                log.warning("concurrency slots lost to an expired lease", extra={
                    "kind": self.key.kind, "route": self.key.route, "slots": sorted(lost)})

    def close(self) -> None:
        with self.cond:
            slots, self.free = list(self.held), []
            self.held.clear()
        if slots:
            with self.limiter.begin() as conn:
                release_slots(conn, self.key, self.limiter.worker, slots)


@dataclass
class _Seen:
    """One endpoint's calls over the last minute, in one-second buckets, and those in flight."""

    buckets: dict[int, list[float]] = field(default_factory=dict)  # second → calls, 429s, waited, called
    in_flight: int = 0

    def add(self, throttled: bool, waited_s: float, called_s: float) -> None:
        second = int(time.monotonic())
        bucket = self.buckets.setdefault(second, [0, 0, 0.0, 0.0])
        bucket[0] += 1
        bucket[1] += throttled
        bucket[2] += waited_s
        bucket[3] += called_s

    def last_minute(self, kind: str, endpoint: str, window_s: float) -> EndpointStats:
        since = int(time.monotonic()) - WINDOW_S
        for second in [s for s in self.buckets if s <= since]:
            del self.buckets[second]
        sums = [sum(b[i] for b in self.buckets.values()) for i in range(4)]
        return EndpointStats(kind, endpoint, int(sums[0]), int(sums[1]), sums[2], sums[3], window_s, self.in_flight)


class Limiter:
    """A worker's gates, one per route it calls through, and what its calls saw per endpoint."""

    def __init__(self, engine: Engine, worker: str, lease_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.worker = worker
        self.lease_s = lease_s
        self.clock = clock
        self.gates: dict[RouteKey, Gate] = {}
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, str], _Seen] = {}
        self.started = clock()
        self.flushed = clock()
        self.flushing = threading.Lock()

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction on the limits' tables, committed without waiting for its flush."""
        with self.engine.begin() as conn:
            without_flush(conn)
            yield conn

    def gate(self, kind: CleanupKind, endpoint: str, tenant: str) -> Gate:
        """The gate of the route a call of `kind` to `endpoint` for `tenant` goes through; its
        route's row (and slots) made on first use."""
        key = route_key(kind.name, kind.limits, endpoint, tenant)
        with self.lock:
            gate = self.gates.get(key)
        if gate is None:
            with self.begin() as conn:
                ensure_route(conn, key, kind.limits)
            with self.lock:
                gate = self.gates.setdefault(key, Gate(self, key, kind.limits))
        return gate

    def in_flight(self, kind: str, endpoint: str, change: int) -> None:
        with self.lock:
            self.seen.setdefault((kind, endpoint), _Seen()).in_flight += change
        observe_in_flight(kind, endpoint, change)

    def count(self, kind: str, endpoint: str, failure: EffectFailure | None, waited_s: float,
              called_s: float) -> None:
        throttled = failure is not None and failure.slow_down
        with self.lock:
            self.seen.setdefault((kind, endpoint), _Seen()).add(throttled, waited_s, called_s)
        outcome = "ok" if failure is None else "throttled" if throttled else failure.failure_class
        observe_call(kind, endpoint, outcome, waited_s, called_s)
        if self.clock() - self.flushed >= STATS_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Write what this worker saw per endpoint (one statement), at most one writer at a time;
        a database that cannot take it is logged and tried again at the next flush."""
        if not self.flushing.acquire(blocking=False):
            return
        try:
            window = min(float(WINDOW_S), self.clock() - self.started)
            with self.lock:
                stats = [seen.last_minute(kind, endpoint, window) for (kind, endpoint), seen in self.seen.items()]
            with self.begin() as conn:
                write_stats(conn, self.worker, [s for s in stats if s.calls or s.in_flight], database_clock(conn))
            self.flushed = self.clock()
        except Exception as exc:  # what status shows is not worth a call
            log.warning("call statistics not written", extra={"error": type(exc).__name__})
            self.flushed = self.clock()
        finally:
            self.flushing.release()

    def renew(self) -> None:
        for gate in list(self.gates.values()):
            gate.renew()

    def release_idle(self) -> None:
        """Give back every concurrency slot no call uses now (a run's calls are done)."""
        for gate in list(self.gates.values()):
            gate.release_idle()

    def close(self) -> None:
        """Give back every slot held and write the last statistics."""
        for gate in list(self.gates.values()):
            try:
                gate.close()
            except Exception as exc:  # the slots expire with their lease anyway
                log.warning("concurrency slots not given back", extra={"error": type(exc).__name__})
        if self.seen:
            self.flush()
