"""The fairness figure (docs/design/limits.md, docs/performance.md): tenant A holds a backlog of
due rows, due before tenants B-E's 100 each; two worker processes on Apache Kafka and PostgreSQL,
the sweep from a measured start (lapse.devtools.bench.fairness, also a `lapse bench` stage). In
every run with the backlog the small tenants' rows are done before A's backlog is, at most a few
pages into it; the figure (their median time with A's backlog over their median time without it,
and A's rate) is printed for docs/performance.md. In `make scale` only: the suite has the order of
completion at 3,400 rows (tests/integration/test_fairness.py) and the stage at 1,000 rows in the
quick bench (tests/system/test_bench.py)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from lapse.devtools.bench.fairness import BACKLOG_TENANT, SMALL_TENANTS, run_fairness
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from tests.fixtures.pipeline import make_pipeline_settings

pytestmark = [pytest.mark.slow, pytest.mark.scale]


def applied_order(engine) -> list[str]:
    """The tenants of the applied rows of the last run, in the order the ledger recorded them."""
    ledger, moves = cleanup_ledger.c, ledger_transitions.c
    with engine.connect() as conn:
        return list(conn.execute(
            select(ledger.tenant).join(ledger_transitions, moves.op_key == ledger.op_key)
            .where(moves.to_state == "applied", ledger.tenant.in_((BACKLOG_TENANT, *SMALL_TENANTS)))
            .order_by(moves.id)).scalars())


BACKLOG = 100_000


def test_a_tenants_backlog_leaves_the_other_tenants_their_time(kafka_bootstrap, pg_url, unique, engine):
    figure = run_fairness(make_pipeline_settings(kafka_bootstrap, pg_url, unique), BACKLOG, repeats=3)
    print("fairness figure:", json.dumps(figure))
    order = applied_order(engine)  # the last run, with the backlog
    last_small = max(i for i, tenant in enumerate(order) if tenant in SMALL_TENANTS)
    assert order.count(BACKLOG_TENANT) == BACKLOG and len(order) == BACKLOG + 400
    assert order[:last_small].count(BACKLOG_TENANT) <= 2_000  # a few pages into A's backlog, not behind it
