"""The Lapse stage: K CleanupWorker processes (supervisor roles) drain the stage's expiry topic
with the stage's cleanup group into a fresh ledger; the rate is measured until the ledger shows
every row terminal."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from lapse.devtools.bench.events import committed_all, encoded_records, produce_encoded, wait_group_stable
from lapse.devtools.bench.ledger_watch import ledger_span, released_count, wait_terminal
from lapse.kernel.database import engine_from_settings
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.settings import Settings
from lapse.shell.roles import child_of
from lapse.shell.supervisor import Supervisor


def start_workers(settings: Settings, workers: int) -> Supervisor:
    roles = [child_of("process", f"bench-process-{i}") for i in range(workers)]
    sup = Supervisor(settings, roles)
    sup.start()
    return sup


def run_lapse(settings: Settings, events: int, workers: int) -> dict[str, Any]:
    """Drain the `events` records of the stage's expiry topic with `workers` processes (batch size,
    database and topics from the stage's `settings`); the rate and the checks."""
    return _drained(settings, events, workers, lambda _sup: None)


def run_lapse_joined(settings: Settings, events: Sequence[ExpiryEvent], workers: int) -> dict[str, Any]:
    """Like `run_lapse`, but the `workers` join the group and take their partitions first, and only
    then are `events` (encoded beforehand) produced to the stage's empty expiry topic: the rate of
    that many workers side by side, without the rebalance a backlog waiting at the start puts in it."""
    topic = settings.topology.expiry
    records = encoded_records(settings, events, datetime.now(UTC))

    def when_joined(sup: Supervisor) -> None:
        wait_group_stable(settings, settings.topology.groups.cleanup, workers,
                          alive=lambda: all(p.is_alive() for p in sup.procs.values()))
        produce_encoded(settings, topic, records)
    result = _drained(settings, len(events), workers, when_joined)
    return {**result, "joined_first": True}


def _drained(settings: Settings, events: int, workers: int, when_started: Callable[[Supervisor], None]
             ) -> dict[str, Any]:
    """Start `workers`, call `when_started`, wait until `events` ledger rows are terminal; the figures."""
    engine = engine_from_settings(settings)
    started = time.time()
    sup = start_workers(settings, workers)
    try:
        when_started(sup)
        alive = lambda: all(p.is_alive() for p in sup.procs.values())
        seen_at = wait_terminal(engine, events, alive=alive)
    finally:
        sup.shutdown()
    span = ledger_span(engine, events, seen_at)
    released = released_count(engine)
    engine.dispose()
    topology = settings.topology
    return {
        "workers": workers, "batch_size": settings.processor.batch_size, "events": events,
        "seconds": round(span.seconds, 3), "events_per_s": round(span.rate, 1),
        "startup_s": round(seen_at - started - span.seconds, 3),
        "released": released,
        "offsets_committed": committed_all(settings, topology.expiry, topology.groups.cleanup),
    }
