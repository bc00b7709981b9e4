"""The soak's pre-seeded history: millions of finished ledger rows (each with its one transition),
written by PostgreSQL itself from `generate_series`, so seeding 2,000,000 rows takes seconds, not a
Python loop's minutes.

Their finish times are spread evenly over a span the caller chooses (the soak: a day that ended
at its retention horizon, so all of them are for pruning to remove while the load runs).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Engine, text

SEED_CHUNK = 250_000  # rows per statement: one transaction per chunk keeps WAL and locks bounded

_LEDGER = """
INSERT INTO {schema}lapse_ledger (op_key, kind, tenant, subject_id, state, attempt, due_at,
    correlation_id, source, duplicates, created_at, updated_at, finished_at)
SELECT 'release-reservation:seed-' || g, 'release-reservation', 'tenant-' || (g % 7), 'seed-' || g,
       'applied', 1, t, md5(g::text), 'sweep', 0, t, t, t
FROM (SELECT g, CAST(:newest AS timestamptz) - make_interval(secs => (g % :span_s)) AS t
      FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g) AS s
"""
_TRANSITIONS = """
INSERT INTO {schema}lapse_transitions (op_key, from_state, to_state, attempt, actor, correlation_id, at)
SELECT 'release-reservation:seed-' || g, NULL, 'applied', 1, 'soak-seed', md5(g::text),
       CAST(:newest AS timestamptz) - make_interval(secs => (g % :span_s))
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
"""


def seed_finished(engine: Engine, schema: str | None, rows: int, newest: datetime, span: timedelta,
                  advance: Callable[[int], None] = lambda _rows: None) -> None:
    """Insert `rows` applied ledger rows (op keys `release-reservation:seed-N`, subjects no business
    row has) finished between `newest - span` and `newest`, each with its transition, then ANALYZE;
    `advance(n)` after each chunk of n rows."""
    prefix = f'"{schema}".' if schema else ""
    span_s = max(1, int(span.total_seconds()))
    for first in range(1, rows + 1, SEED_CHUNK):
        last = min(rows, first + SEED_CHUNK - 1)
        params = {"first": first, "last": last, "newest": newest, "span_s": span_s}
        with engine.begin() as conn:
            conn.execute(text(_LEDGER.format(schema=prefix)), params)
            conn.execute(text(_TRANSITIONS.format(schema=prefix)), params)
        advance(last - first + 1)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"ANALYZE {prefix}lapse_ledger"))
        conn.execute(text(f"ANALYZE {prefix}lapse_transitions"))
