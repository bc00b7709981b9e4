"""`lapse kinds plan` on a 10,000,000-row business table (PostgreSQL): the preview finishes, with
its default cap and timeout, reading along the kind's due index, its counts exact below the cap
and marked capped at it.

The demo's reservations table is filled by generate_series in SQL (its due index dropped during
the load and rebuilt after, the table UNLOGGED: a throwaway database), due times spread evenly
over 60 days before and 60 days after now, four in five held. The test prints how long the seed
and the preview took, with the default cap and with one above the table's size (exact counts);
docs/performance.md keeps the figures. No assertion on time."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import text

from lapse.devtools.demo_kinds import RELEASE, packaged_kinds_file
from lapse.kernel.database import make_engine
from lapse.kernel.kinds.plan import DEFAULT_CAP
from lapse.kernel.settings import env_var
from tests.fixtures.processes import run_lapse

ROWS = 10_000_000
SPAN_S = 120 * 86_400  # due times from 60 days ago to 60 days ahead
SEED = """
INSERT INTO reservations (tenant, status, expires_at)
SELECT 'tenant-' || (g % 100), CASE WHEN g % 5 = 0 THEN 'paid' ELSE 'held' END,
       CAST(:now AS timestamptz) - interval '60 days' + (g * CAST(:step AS float8)) * interval '1 second'
FROM generate_series(1, :rows) g
"""


@pytest.mark.scale
@pytest.mark.slow
def test_the_preview_of_a_kind_over_ten_million_rows_finishes_along_its_index(pg_url, tmp_path):
    engine = make_engine(pg_url, statement_timeout_s=None)
    started = time.monotonic()
    with engine.begin() as conn:
        now = conn.execute(text("SELECT date_trunc('second', now())")).scalar_one()
        conn.exec_driver_sql("ALTER TABLE reservations SET UNLOGGED")
        conn.exec_driver_sql("DROP INDEX ix_reservations_held_due")
        conn.execute(text(SEED), {"now": now, "step": SPAN_S / ROWS, "rows": ROWS})
        conn.exec_driver_sql("CREATE INDEX ix_reservations_held_due ON reservations (expires_at, id) "
                             "WHERE status = 'held'")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE reservations")
    seeded = time.monotonic() - started
    engine.dispose()

    env = {env_var("database.url"): pg_url, env_var("kinds.file"): str(packaged_kinds_file())}
    (done,) = run_lapse(["kinds", "plan", RELEASE, "--at", now.isoformat(), "--json"], env=env, cwd=tmp_path,
                        bound_s=600.0)
    assert done.code == 0, done.stderr
    (plan,) = json.loads(done.stdout)["kinds"]
    print(f"\nseeded {ROWS:,} rows in {seeded:.0f} s; `lapse kinds plan` took {done.seconds:.1f} s "
          f"(due now {plan['due_now']}, next 24 h {plan['next_24h']:,})")

    per_hour = 3600 * ROWS / SPAN_S * 4 / 5  # held rows due in an hour: 3,472 of which 4 in 5
    assert plan["due_index"] == "ix_reservations_held_due"
    assert plan["due_now"] == {"rows": DEFAULT_CAP, "capped": True}  # 4,000,000 held rows are due
    assert plan["eligible"] == {"rows": DEFAULT_CAP, "capped": True}
    assert all(abs(h["rows"] - per_hour) <= 2 and not h["capped"] for h in plan["hours"])
    assert plan["tenants"]["next_24h"]["tenants"] == 80  # g % 5 = 0 is paid: tenants 0, 5, 10… never held
    assert len(plan["sample"]) == 10

    # Exact counts: a cap above the table's size walks all 8,000,000 held rows (timed, not asserted).
    (exact,) = run_lapse(["kinds", "plan", RELEASE, "--at", now.isoformat(), "--cap", str(ROWS), "--limit", "0",
                          "--timeout", "600", "--json"], env=env, cwd=tmp_path, bound_s=900.0)
    assert exact.code == 0, exact.stderr
    (whole,) = json.loads(exact.stdout)["kinds"]
    print(f"with --cap {ROWS:,}: {exact.seconds:.1f} s (due now {whole['due_now']}, eligible {whole['eligible']})")
    assert abs(whole["due_now"]["rows"] - ROWS * 2 // 5) <= 1 and not whole["due_now"]["capped"]
    assert whole["eligible"] == {"rows": ROWS * 4 // 5, "capped": False}
    assert [h["rows"] for h in whole["hours"]] == [h["rows"] for h in plan["hours"]]
