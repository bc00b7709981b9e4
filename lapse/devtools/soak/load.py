"""The soak's offered load: a steady stream of business rows coming due and their expiry events,
produced by a thread at a fixed rate, the way an upstream service emits them.

Every 200 events hold the mix a cleanup pipeline meets in service (`MIX`): most holds simply
expire; some were paid in time (skipped); some were extended after their event left (not yet due:
they wait on the delay tiers and are released later); some are export files whose object store
fails now and then (retried, some dead-lettered); one is poison (bytes no codec reads).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, insert

from lapse.devtools.demo_kinds import ARTIFACT_DELETE
from lapse.devtools.demo_tables import artifacts, reservations
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker, make_producer
from lapse.kernel.ledger import ExpiryEvent, expiry_event
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.processors import FilesystemObjectStore
from lapse.producers import emit_events

log = get_logger("soak")

RESERVATION = "release-reservation"
TICK_S = 0.2  # the load is offered in slices this long
# Out of every 200 events (the rest are holds that simply expire).
MIX = {"paid": 10, "extended": 10, "artifact": 9, "poison": 1}
EXTENDED_BY = timedelta(seconds=20)  # an extended hold comes due again this much later


@dataclass
class Offered:
    """What the load offered so far, by sort."""

    events: int = 0
    by_sort: dict[str, int] = field(default_factory=dict)

    def add(self, sort: str, n: int) -> None:
        self.events += n
        self.by_sort[sort] = self.by_sort.get(sort, 0) + n


def sorts_of(count: int, start: int) -> dict[str, int]:
    """How many events of each sort the `count` events from position `start` of the stream hold:
    position i takes its sort from i % 200, so any long stretch has the mix of `MIX`."""
    bounds, edge = [], 0
    for sort, n in MIX.items():
        bounds.append((edge, edge + n, sort))
        edge += n
    out: dict[str, int] = {}
    for i in range(start, start + count):
        slot = i % 200
        sort = next((s for lo, hi, s in bounds if lo <= slot < hi), "expired")
        out[sort] = out.get(sort, 0) + 1
    return out


class OfferedLoad:
    """A thread offering `rate` events/s until `stop()`; `offered` counts what it produced."""

    def __init__(self, settings: Settings, engine: Engine, rate: float, objects: Path) -> None:
        self.settings = settings
        self.engine = engine
        self.rate = rate
        self.store = FilesystemObjectStore(objects)
        self.codec = Codec.from_settings(settings)
        self.producer = make_producer(settings, **{"linger.ms": 5})
        self.delivery = DeliveryTracker()
        self.offered = Offered()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._rng = random.Random(11)
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started (a run that failed warming up never was)
            self._thread.join(30)
        self.producer.flush(10)

    def _tenants(self, n: int) -> list[str]:
        return [f"tenant-{self._rng.randrange(7)}" for _ in range(n)]

    def _run(self) -> None:
        started, before = time.monotonic(), self.offered.events
        try:
            while not self._stop.is_set():
                owed = self.rate * (time.monotonic() - started) - (self.offered.events - before)
                if owed >= 1:
                    self.offer(int(owed))
                self._stop.wait(TICK_S)
        except BaseException as exc:  # reported by the runner, which stops the soak
            self.error = exc
            log.exception("soak load failed")

    def offer(self, count: int) -> None:
        """Insert the business rows of the next `count` events of the stream and produce the events."""
        now = datetime.now(UTC)
        sorts = sorts_of(count, self.offered.events)
        # An extended hold's event left at its first due time, before the extension.
        due = now - timedelta(seconds=1)
        events: list[ExpiryEvent] = []
        with self.engine.begin() as conn:
            for sort, status, expires_at in (("expired", "held", due), ("paid", "paid", due),
                                             ("extended", "held", now + EXTENDED_BY)):
                tenants = self._tenants(sorts.get(sort, 0))
                if not tenants:
                    continue
                ids = conn.execute(insert(reservations).returning(reservations.c.id), [
                    {"tenant": t, "status": status, "expires_at": expires_at} for t in tenants]).scalars().all()
                events += [expiry_event(RESERVATION, i, t, due, source="upstream")
                           for i, t in zip(ids, tenants, strict=True)]
            if tenants := self._tenants(sorts.get("artifact", 0)):
                keys = [f"soak/{now.timestamp():.6f}-{k}.csv" for k in range(len(tenants))]
                ids = conn.execute(insert(artifacts).returning(artifacts.c.id), [
                    {"tenant": t, "status": "live", "object_key": key, "retain_until": now}
                    for t, key in zip(tenants, keys, strict=True)]).scalars().all()
                for key in keys:
                    self.store.put(key, b"lapse soak export")
                events += [expiry_event(ARTIFACT_DELETE, i, t, now, source="upstream")
                           for i, t in zip(ids, tenants, strict=True)]
        topic = self.settings.topology.expiry
        emit_events(self.producer, self.codec, self.delivery, topic, events, now)
        for _ in range(sorts.get("poison", 0)):
            self.producer.produce(topic, key=b"soak-poison", value=self._rng.randbytes(24))
        for sort, n in sorts.items():
            self.offered.add(sort, n)
