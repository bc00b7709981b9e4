"""The relay as its own stage: the outbox a worker leaves after `n` events (written by the
processor's batch transaction) published by one relay at the settings' batch size, then the same
rows, unsent again, by two relays in parallel (leased hash slots; timed once the two have split the
slots). Verified when no row is left unsent and the outcomes topic holds one record per row and run."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, func, select, update

from lapse.devtools.bench.events import create_role_topic, end_offsets
from lapse.devtools.bench.limits import batch_transaction_alone
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.models import outbox
from lapse.kernel.settings import Settings
from lapse.producers import SLOTS, relay_until_empty, slot_holders
from lapse.producers import run_relay as run_relay_loop

PARALLEL = 2
SPLIT_BOUND_S = 30.0  # for the relays to split the slots before the timed run
POLL_S = 0.01


def run_relay(settings: Settings, events: Sequence[ExpiryEvent], partitions: int) -> dict[str, Any]:
    """Fill the stage's outbox with the outcomes of `events`, then time one relay draining it and,
    on PostgreSQL, two relays draining it again (`relay_2_vs_1`)."""
    batch_transaction_alone(settings, events, worker="bench-relay")
    topic = create_role_topic(settings, "outcomes", partitions)
    engine = engine_from_settings(settings)
    producer = make_producer(settings)
    limit = settings.producer.relay_batch_size
    runs = 1
    two: dict[str, Any] | None = None
    try:
        started = time.perf_counter()
        rows = relay_until_empty(engine, producer, Codec.from_settings(settings), limit)
        seconds = time.perf_counter() - started
        if engine.dialect.name == "postgresql":
            two = _parallel(settings, engine, PARALLEL)
            runs += 1
        unsent = _unsent(engine)
    finally:
        producer.flush(10)
        engine.dispose()
    published = sum(end_offsets(settings, topic).values())
    reason = None
    if unsent or published != runs * len(events) or rows != len(events):
        reason = (f"{rows} rows relayed, {unsent} left unsent, {published} records on {topic}, "
                  f"{runs * len(events)} expected")
    rate = round(rows / seconds, 1) if seconds else None
    out: dict[str, Any] = {"rows": rows, "batch_size": limit, "seconds": round(seconds, 3), "rows_per_s": rate,
                           "verified": reason is None, "reason": reason}
    if two is not None:
        out["two_relays"] = two
        out["relay_2_vs_1"] = round(two["rows_per_s"] / rate, 2) if rate and two["rows_per_s"] else None
    return out


def _unsent(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(outbox)
                                .where(outbox.c.sent_at.is_(None))).scalar_one())


def _parallel(settings: Settings, engine: Engine, relays: int) -> dict[str, Any]:
    """Start `relays` relays on the (sent) outbox, wait until they split the slots, mark every row
    unsent again and time them until none is left."""
    stop = threading.Event()
    totals = [0] * relays

    def relay(i: int) -> None:
        totals[i] = run_relay_loop(engine, make_producer(settings), Codec.from_settings(settings),
                              limit=settings.producer.relay_batch_size, idle_s=POLL_S, stop=stop)

    threads = [threading.Thread(target=relay, args=(i,), name=f"bench-relay-{i}") for i in range(relays)]
    for thread in threads:
        thread.start()
    try:
        share = -(-SLOTS // relays)
        deadline = time.monotonic() + SPLIT_BOUND_S
        while sorted(slot_holders(engine).values(), reverse=True) != [share] * (SLOTS // share) + (
                [SLOTS % share] if SLOTS % share else []):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{relays} relays did not split the {SLOTS} slots within {SPLIT_BOUND_S:g} s")
            time.sleep(0.1)
        with engine.begin() as conn:
            rows = conn.execute(update(outbox).values(sent_at=None)).rowcount
        started = time.perf_counter()
        while _unsent(engine):
            time.sleep(POLL_S)
        seconds = time.perf_counter() - started
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    return {"relays": relays, "rows": rows, "seconds": round(seconds, 3),
            "rows_per_s": round(rows / seconds, 1) if seconds else None, "per_relay": totals}
