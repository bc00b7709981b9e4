"""The Lapse stage: K CleanupWorker processes (supervisor roles) drain the expiry topic with a
fresh group into a fresh ledger; the rate is measured until the ledger shows every row terminal."""

from __future__ import annotations

import time
from typing import Any

from pydantic import SecretStr

from lapse.devtools.bench.events import committed_all, unique_name
from lapse.devtools.bench.ledger_watch import ledger_span, released_count, wait_terminal
from lapse.kernel.database import make_engine
from lapse.kernel.settings import Settings
from lapse.shell.roles import run_worker
from lapse.shell.supervisor import Role, Supervisor


def worker_settings(base: Settings, database_url: str, topic: str, group: str, batch_size: int) -> Settings:
    """The workers' settings: this stage's database, topic, group and batch size."""
    return base.model_copy(update={
        "database_url": SecretStr(database_url), "expiry_topic": topic, "cleanup_group": group,
        "batch_size": batch_size,
    })


def start_workers(settings: Settings, workers: int) -> Supervisor:
    roles = [Role(f"bench-process-{i}", run_worker, {}) for i in range(workers)]
    sup = Supervisor(settings, roles)
    sup.start()
    return sup


def run_lapse(base: Settings, database_url: str, topic: str, events: int, workers: int,
              batch_size: int) -> dict[str, Any]:
    """Drain `events` records of `topic` with `workers` processes; the rate and the checks."""
    group = unique_name("bench-lapse")
    settings = worker_settings(base, database_url, topic, group, batch_size)
    engine = make_engine(database_url)
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
    return {
        "workers": workers, "batch_size": batch_size, "events": events,
        "seconds": round(span.seconds, 3), "events_per_s": round(span.rate, 1),
        "startup_s": round(seen_at - started - span.seconds, 3),
        "released": released, "offsets_committed": committed_all(base, topic, group),
    }
