"""Latency at a fixed offered load: a paced producer emits events for fresh reservations while one
worker runs; latency runs from each record's produce timestamp to its ledger row turning terminal.

Two figures per event: to the row's `finished_at` (stamped when its batch starts, so a lower
bound) and to when a watcher polling every few ms saw the row terminal (an upper bound).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from sqlalchemy import Engine, select

from lapse.devtools.bench.events import produce_events, reservation_event
from lapse.devtools.bench.lapse_stage import start_workers
from lapse.devtools.bench.ledger_watch import StageFailed, wait_terminal
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.ledger import TERMINAL, expiry_record
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import Settings

WATCH_POLL_S = 0.02


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def run_latency(settings: Settings, rate: float, events: int, warmup: int = 0) -> dict[str, Any]:
    """Offer `rate` events/s (ids 2..events+1 of the seeded holds) on the stage's empty expiry topic
    to one worker; percentiles in ms. First `warmup` events (the ids after those) are offered at the
    same rate and left out of the figures: the worker's first batches also pay for connections and
    for statements the driver has not prepared yet, which is start-up, not steady-state latency."""
    topic = settings.topology.expiry
    engine = engine_from_settings(settings)
    sup = start_workers(settings, 1)
    alive = lambda: all(p.is_alive() for p in sup.procs.values())
    watcher = TerminalWatcher(engine)
    try:
        produce_events(settings, topic, [reservation_event(1, datetime.now(UTC))], datetime.now(UTC))
        wait_terminal(engine, 1, alive=alive)  # the worker has joined and caught up
        # One producer for both phases: a new one's first records wait in it for its connections and
        # its idempotent producer id (hundreds of ms), which is the producer's start, not the pipeline.
        producer = make_producer(settings)
        if warmup:
            _paced_produce(settings, producer, topic, range(events + 2, events + 2 + warmup), rate)
            wait_terminal(engine, 1 + warmup, alive=alive)
        watcher.start()
        produced = _paced_produce(settings, producer, topic, range(2, events + 2), rate)
        while len(watcher.seen) < events + 1 + warmup:
            if not alive() or watcher.error:
                why = f"the watcher failed: {watcher.error}" if watcher.error else "the worker exited"
                raise StageFailed(f"{why} with {len(watcher.seen)} of {events + 1 + warmup} rows done")
            time.sleep(WATCH_POLL_S)
    finally:
        watcher.stop()
        sup.shutdown()
        engine.dispose()
    seen = watcher.seen
    to_finished = [(seen[k][0].timestamp() - ts) * 1000 for k, ts in produced.items()]
    to_seen = [(seen[k][1] - ts) * 1000 for k, ts in produced.items()]
    return {
        "offered_events_per_s": round(rate, 1), "events": events, "warmup_events": warmup,
        "batch_size": settings.processor.batch_size,
        **{f"p{q}_ms": round(percentile(to_finished, q), 1) for q in (50, 95, 99)},
        **{f"observed_p{q}_ms": round(percentile(to_seen, q), 1) for q in (50, 95, 99)},
        "max_ms": round(max(to_finished), 1), "latencies_ms": [round(x, 1) for x in to_finished],
    }


class TerminalWatcher:
    """A thread polling for ledger rows that turned terminal since its last poll, through their
    transitions' time index (one worker, so batches commit in that order; polling the ledger
    itself would scan it, on the CPUs the worker measured needs): op_key → (the transition's
    time, which is the row's finished_at, and the wall-clock time first seen)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: dict[str, tuple[datetime, float]] = {}
        self.after: datetime | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-latency-watch", daemon=True)

    def start(self) -> None:
        self.poll()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(WATCH_POLL_S):
                self.poll()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def poll(self) -> None:
        stmt = select(T.c.op_key, T.c.at).where(T.c.to_state.in_(TERMINAL))
        if self.after is not None:
            stmt = stmt.where(T.c.at > self.after)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        now = time.time()
        for key, finished in rows:
            self.seen.setdefault(key, (finished, now))
            self.after = finished if self.after is None else max(self.after, finished)


def _paced_produce(settings: Settings, producer: Producer, topic: str, ids: Iterable[int], rate: float
                   ) -> dict[str, float]:
    """Produce one event per id at `rate`/s; op_key → record timestamp in epoch seconds."""
    codec = Codec.from_settings(settings)
    stamps: dict[str, float] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        key = msg.key()
        if err is None and key is not None:
            stamps[key.decode()] = msg.timestamp()[1] / 1000

    # Encoded before the clock starts: the producer shares the worker's cores, and what it spends
    # per record is taken from the pipeline measured (the record's timestamp is taken at produce).
    now = datetime.now(UTC)
    records = [(event.op_key.encode(), codec.encode(EXPIRY_EVENT, expiry_record(event, now)))
               for event in (reservation_event(rid, now) for rid in ids)]
    started = time.perf_counter()
    for i, (key, value) in enumerate(records):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
        producer.poll(0)
    producer.flush(30)
    return stamps
