"""The worker rides out a database outage: the failed batch is rewound and retried, not lost."""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.fixtures.db import admin_url
from tests.fixtures.pipeline import applied, assert_each_applied_once, expiry_event, produce, seed
from tests.fixtures.polling import eventually
from tests.fixtures.workers import running_workers


def test_worker_rewinds_and_retries_through_a_database_outage(pipeline):
    first = seed(pipeline, 50)
    second = seed(pipeline, 50)
    produce(pipeline, [expiry_event(i) for i in first])
    with running_workers(pipeline.settings) as running:
        (worker,) = running.workers
        eventually(lambda: applied(pipeline) == 50, timeout_s=90, what="the first 50 applied")

        database = make_url(pipeline.settings.database.url_plain()).database
        admin = create_engine(admin_url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false'))
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": database})
            produce(pipeline, [expiry_event(i) for i in second])
            eventually(lambda: worker.stats.batch_failures >= 1, timeout_s=90, what="a failed batch")
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true'))
            admin.dispose()

        eventually(lambda: applied(pipeline) == 100, timeout_s=90, what="all 100 applied after the outage")
    running.stats()  # stopped, and no worker thread failed
    assert_each_applied_once(pipeline, 100)
