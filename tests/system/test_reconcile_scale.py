"""The reconciler on a 1,000,000-row business table (PostgreSQL): bounded memory, and an index
behind every query it runs (EXPLAIN shows no Seq Scan on the big tables)."""

from __future__ import annotations

import tracemalloc
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from lapse.kernel.database import qualified_name
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import CLAIMED, PENDING, RETRY_SCHEDULED, mark_stuck_statement
from lapse.kernel.models import cleanup_ledger
from lapse.reconciler import queries
from lapse.reconciler.scan import Reconciler
from tests.fixtures.kafka import read_topic

ROWS = 1_000_000
HELD_EVERY = 20         # every 20th reservation is still held and expired: 50,000 eligible rows
MISSING_EVERY = 50_000  # of those, every 50,000th id has no ledger row (20 rows)
STUCK_AT = 25_000       # and ids ≡ 25,000 (mod 50,000) hold a lease that ended long ago (20 rows)
PAGE = 1000
PEAK_BOUND = 8 * 1024 * 1024  # 50,000 eligible rows held at once would need several times more

NOW = datetime.now(UTC).replace(microsecond=0)
DUE = NOW - timedelta(hours=2)

# Reservations: every HELD_EVERY-th still held (and claimed under a live lease in the ledger), the
# rest released. Released rows get no ledger rows here: the reconciler never looks them up, and
# leaving them out keeps the load fast.
RESERVATIONS = """
INSERT INTO reservations (id, tenant, status, expires_at, released_at)
SELECT g, 'tenant-' || (g % 7), CASE WHEN g % :held = 0 THEN 'held' ELSE 'released' END,
       :due - (g % 3600) * interval '1 second', CASE WHEN g % :held = 0 THEN NULL ELSE :due END
FROM generate_series(1, :rows) g
"""
LEDGER = """
INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at, claim_owner,
                            claim_until, correlation_id, source, duplicates, created_at, updated_at,
                            finished_at)
SELECT 'release-reservation:' || g, 'release-reservation', 'tenant-' || (g % 7), g::text,
       'claimed', 0, :due - (g % 3600) * interval '1 second', 'w1',
       CASE WHEN g % :missing = :stuck THEN :due ELSE :now + interval '1 hour' END,
       'c' || g, 'sweep', 0, :due, :due, NULL
FROM generate_series(:held, :rows, :held) g
WHERE g % :missing <> 0
"""


def load(engine) -> None:
    params = {"rows": ROWS, "held": HELD_EVERY, "missing": MISSING_EVERY, "stuck": STUCK_AT,
              "due": DUE, "now": NOW}
    with engine.begin() as conn:
        conn.execute(text(RESERVATIONS), params)
        conn.execute(text(LEDGER.format(ledger=qualified_name(conn, cleanup_ledger))), params)
        conn.execute(text("SELECT setval('reservations_id_seq', :rows)"), params)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE reservations"))
        conn.execute(text(f"ANALYZE {qualified_name(conn, cleanup_ledger)}"))


def plan(conn, stmt) -> str:
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    rows = conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).scalars()
    return "\n".join(rows)


@pytest.mark.slow
def test_million_row_table_is_scanned_in_bounded_memory_with_indexes_only(pipeline):
    p = pipeline
    load(p.engine)
    cutoff = NOW - timedelta(seconds=p.settings.reconciler.grace_s)
    release = load_kinds(p.settings, p.engine)["release-reservation"]

    with p.engine.connect() as conn:
        statements = {
            "eligible": queries.eligible_statement(release, cutoff, (DUE - timedelta(minutes=30), 5), PAGE, NOW),
            "eligible_first": queries.eligible_statement(release, cutoff, None, PAGE, NOW),
        }
        for state in (PENDING, CLAIMED, RETRY_SCHEDULED):
            statements[f"stuck_{state}"] = mark_stuck_statement(state, cutoff, None, PAGE, NOW)
            statements[f"stuck_{state}_next"] = mark_stuck_statement(
                state, cutoff, (DUE - timedelta(minutes=30), "release-reservation:5"), PAGE, NOW)
        plans = {name: plan(conn, stmt) for name, stmt in statements.items()}
    for name, text_plan in plans.items():
        assert "Seq Scan" not in text_plan, f"{name} scans a table:\n{text_plan[:2000]}"

    settings = p.settings.with_(reconciler={"page_size": PAGE, "rate": 10_000.0})
    rec = Reconciler(p.engine, make_producer(settings), p.codec, settings,
                     {release.name: release},
                     clock=lambda: NOW)
    tracemalloc.start()
    try:
        report = rec.run_once()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert report.scanned == ROWS // HELD_EVERY
    assert report.gaps == {"no_ledger": 20, "stuck_claimed": 20}
    assert report.anomalies == {}
    assert peak < PEAK_BOUND, f"peak {peak / 2**20:.1f} MiB"
    assert len(read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.expiry)) == 40
