"""The worker rides out a database outage: the failed batch is rewound and retried, not lost."""

from __future__ import annotations

import threading
import time
from collections import Counter

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.processors.worker import CleanupWorker
from tests.fixtures_db import admin_url
from tests.test_pipeline import all_committed, expiry_event, produce, seed


def wait_until(condition, timeout_s: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {timeout_s:.0f}s")
        time.sleep(0.2)


def applied(pipeline) -> int:
    with pipeline.engine.connect() as conn:
        return conn.execute(select(func.count()).where(cleanup_ledger.c.state == "applied")).scalar()


def test_worker_rewinds_and_retries_through_a_database_outage(pipeline):
    first = seed(pipeline, 50)
    second = seed(pipeline, 50)
    produce(pipeline, [expiry_event(i) for i in first])
    worker = CleanupWorker(pipeline.settings)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_until(lambda: applied(pipeline) == 50, what="the first 50 applied")

    database = make_url(pipeline.settings.database_url_plain()).database
    admin = create_engine(admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": database})
        produce(pipeline, [expiry_event(i) for i in second])
        wait_until(lambda: worker.stats.batch_failures >= 1, what="a failed batch")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true'))
        admin.dispose()

    wait_until(lambda: applied(pipeline) == 100, what="all 100 applied after the outage")
    worker.stop.set()
    thread.join(30)
    with pipeline.engine.connect() as conn:
        per_key = Counter(conn.execute(select(ledger_transitions.c.op_key)).scalars())
    assert len(per_key) == 100 and set(per_key.values()) == {1}
    assert all_committed(pipeline)
