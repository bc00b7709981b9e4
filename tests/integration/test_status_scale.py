"""`lapse status` and the metrics on a large ledger: no status query scans the ledger (EXPLAIN of every
statement `ledger_status` runs), and the applied/skipped estimates are within 10% of the truth after
ANALYZE; a small ledger is counted exactly.

The default run seeds 200,000 rows (above `EXACT_BELOW_ROWS`, so the estimates are used; a few
seconds); the 2,000,000-row run takes about 35 s to seed on a 2-core machine and is a `bench` test
(`pytest -m bench tests/integration/test_status_scale.py`). Measured there: ledger_status in ~50 ms,
every estimate within 2% of the truth."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, insert, text

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import counts_by_state_and_kind, expiry_event, ledger_counts, pending_row
from lapse.kernel.models import cleanup_ledger
from lapse.readers.status import ledger_status
from lapse.shell.commands.status import _text

KINDS = ("release-reservation", "artifact-delete")

# i % 1000 in 0..3: one of the unfinished states or dead_letter (0.1% each, the small set of a
# healthy system); i % 10 = 5: skipped (10%); every other row applied. Kind by i % 3.
SEED = """
INSERT INTO lapse.lapse_ledger (op_key, kind, tenant, subject_id, state, attempt, due_at, claim_owner,
    claim_until, correlation_id, source, duplicates, created_at, updated_at, finished_at)
SELECT k || ':' || i, k, 't1', i::text, s, 1, now() - interval '1 day',
       CASE WHEN s = 'claimed' THEN 'w' END, CASE WHEN s = 'claimed' THEN now() - interval '1 minute' END,
       'c', 'sweep', 0, now() - interval '1 day', now(),
       CASE WHEN s IN ('applied', 'skipped', 'dead_letter') THEN now() END
FROM (SELECT i, CASE WHEN i % 3 = 0 THEN :other ELSE :kind END AS k,
             CASE i % 1000 WHEN 0 THEN 'pending' WHEN 1 THEN 'claimed' WHEN 2 THEN 'retry_scheduled'
                           WHEN 3 THEN 'dead_letter'
                           ELSE CASE WHEN i % 10 = 5 THEN 'skipped' ELSE 'applied' END END AS s
      FROM generate_series(1, :rows) AS i) AS g
"""


def _by_state(counts) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for c in counts:
        out[c.state][c.kind] = c.rows
    return dict(out)


@pytest.mark.slow
@pytest.mark.parametrize("rows", [200_000, pytest.param(2_000_000, marks=pytest.mark.bench)])
def test_status_on_a_large_ledger_reads_indexes_and_estimates_within_ten_percent(pg_url, rows):
    engine = make_engine(pg_url, statement_timeout_s=None)
    started = time.monotonic()
    with engine.begin() as conn:
        # The indexes are dropped for the load and built again after it (several times faster than
        # maintaining them row by row), from their own definitions.
        indexes = conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'lapse' AND tablename = 'lapse_ledger' "
            "AND indexname <> 'pk_lapse_ledger'")).all()
        for name, _ in indexes:
            conn.execute(text(f'DROP INDEX lapse."{name}"'))
        conn.execute(text(SEED), {"rows": rows, "kind": KINDS[0], "other": KINDS[1]})
        for _, definition in indexes:
            conn.execute(text(definition))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE lapse.lapse_ledger"))
    seeded_s = time.monotonic() - started

    with engine.connect() as conn:
        truth = _by_state(counts_by_state_and_kind(conn))
        statements: list[tuple[str, Any]] = []

        def record(_conn, _cursor, statement, parameters, _context, _many):
            statements.append((statement, parameters))

        event.listen(engine, "before_cursor_execute", record)
        try:
            started = time.monotonic()
            status = ledger_status(conn, datetime.now(UTC))
            status_s = time.monotonic() - started
        finally:
            event.remove(engine, "before_cursor_execute", record)

        plans = {}
        for statement, parameters in statements:
            if "lapse_ledger" not in statement:
                continue
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            plans[statement] = plan
            assert "Seq Scan on lapse_ledger" not in plan, plan
        assert any("ix_lapse_ledger_unfinished_due" in p for p in plans.values()), plans
        assert any("ix_lapse_ledger_dead_letters" in p for p in plans.values()), plans

    assert status["ledger_estimated"] == ["applied", "skipped"]
    shown_text = _text(status).splitlines()
    assert shown_text[0] == "ledger: (~: estimated)"
    assert any(line.split()[0] == "applied" and f"{KINDS[0]}=~" in line for line in shown_text), shown_text
    assert any(line.split()[0] == "pending" and "=~" not in line for line in shown_text), shown_text
    shown = status["ledger"]
    for state in ("pending", "claimed", "retry_scheduled", "dead_letter"):
        assert shown[state] == truth[state], state  # exact, through the partial indexes
    assert status["dead_letters"] == sum(truth["dead_letter"].values()) == rows // 1000
    for state in ("applied", "skipped"):
        for kind in KINDS:
            assert shown[state][kind] == pytest.approx(truth[state][kind], rel=0.10), (state, kind)
        assert sum(shown[state].values()) == pytest.approx(sum(truth[state].values()), rel=0.10), state
    total = sum(n for kinds in shown.values() for n in kinds.values())
    assert total == pytest.approx(rows, rel=0.02)
    # The times are figures to read, not assertions (the plans above are what holds it fast).
    print(f"{rows} rows seeded in {seeded_s:.1f} s; ledger_status in {status_s * 1000:.0f} ms")
    engine.dispose()


def test_a_small_ledger_is_counted_exactly_even_when_analyzed(pg_url):
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    states = ["pending", "claimed", "applied", "applied", "skipped", "dead_letter", "retry_scheduled"]
    rows = []
    for i, state in enumerate(states):
        event_ = expiry_event(KINDS[i % 2], str(i), "t1", now, source="sweep", correlation_id="c")
        rows.append({**pending_row(event_, now), "state": state,
                     "finished_at": now if state in ("applied", "skipped", "dead_letter") else None})
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), rows)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE lapse.lapse_ledger"))
    with engine.connect() as conn:
        counted = ledger_counts(conn)
        assert counted.estimated == frozenset()
        assert _by_state(counted.counts) == _by_state(counts_by_state_and_kind(conn))
        status = ledger_status(conn, now)
    assert status["ledger_estimated"] == []
    assert status["ledger"]["applied"] == {KINDS[0]: 1, KINDS[1]: 1}
    engine.dispose()
