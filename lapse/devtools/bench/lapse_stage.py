"""The Lapse stage: K CleanupWorker processes (supervisor roles) drain the stage's expiry topic
with the stage's cleanup group into a fresh ledger; the rate is measured until the ledger shows
every row terminal."""

from __future__ import annotations

import time
from typing import Any

from lapse.devtools.bench.events import committed_all
from lapse.devtools.bench.ledger_watch import ledger_span, released_count, wait_terminal
from lapse.kernel.database import engine_from_settings
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
    engine = engine_from_settings(settings)
    started = time.time()
    sup = start_workers(settings, workers)
    try:
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
