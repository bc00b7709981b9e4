"""The console on a 2,000,000-row ledger (PostgreSQL, Apache Kafka for the lag): the bench's seed
(2,000,000 finished rows over the last day, each with its transition, 4,000 dead letters), every
statement the console adds EXPLAINed (ANALYZE, buffers) along its index, and every page and API
call rendered end to end through the application, its median after a first, cold render. The test
holds every plan but the day's buckets along an index and every page answering; it prints the plans'
times and the pages' figures (docs/performance.md keeps them; their target is the bench's
`console_page_ms`, never a timed assertion: under load the day's overview took 200.4 ms once) and
saves the day's charts (build/console-screenshots/console-charts-day-2m.png, copied to docs/images/)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from selenium.webdriver.common.by import By
from sqlalchemy import event

from lapse.devtools.bench.console_pages import KIND, RECENT_DEAD, seed_console_ledger, time_pages
from lapse.kernel.database import make_engine
from lapse.readers import (
    dead_letter_groups,
    filtered_dead_letters,
    operation_of_subject,
    tenant_operations,
    transition_buckets,
)
from tests.fixtures.console import chart_screenshot, chromium, running_console
from tests.fixtures.pipeline import make_pipeline_settings
from tests.fixtures.polling import eventually

ROWS = 2_000_000


@pytest.mark.scale
@pytest.mark.slow
def test_the_consoles_pages_on_two_million_rows(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique)
    engine = make_engine(pg_url, statement_timeout_s=None)
    newest = datetime.now(UTC) - timedelta(seconds=1)
    seeded = seed_console_ledger(engine, ROWS, newest)
    assert seeded["dead_letters"] == ROWS // 500

    captured: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    with engine.connect() as conn:
        groups = dead_letter_groups(conn)
        page = filtered_dead_letters(conn, limit=101)
        filtered_dead_letters(conn, after=(page[-1]["finished_at"], page[-1]["op_key"]), limit=101)
        transition_buckets(conn, newest - timedelta(days=1), newest, 1800)
        transition_buckets(conn, newest - timedelta(minutes=2), newest, 60)
        operation_of_subject(conn, KIND, f"console-{RECENT_DEAD}")
        tenant_operations(conn, "tenant-3", KIND, None, 50)
        tenant_operations(conn, "tenant-3", None, None, 50)
    event.remove(engine, "before_cursor_execute", capture)
    assert groups["total"] == ROWS // 500
    plans = {}
    with engine.connect() as conn:
        for name, (sql, params) in zip(("groups", "dead letters", "dead letters, page 2", "buckets, day",
                                        "buckets, open minutes", "business id", "tenant, by kind", "tenant"),
                                       captured, strict=True):
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).scalars().all()
            plans[name] = {"execution_ms": float(plan[-1].split(":")[1].split()[0]), "plan": plan}
    # The day's buckets read all of the day's transitions once, when the console starts (a scan is
    # the right plan for that); every other statement, and every render after, walks an index.
    for name, found in plans.items():
        if name != "buckets, day":
            assert "Seq Scan" not in "\n".join(found["plan"]), "\n".join(found["plan"])
        found["plan"] = [line.strip()[:110] for line in found["plan"] if "->" in line or line is found["plan"][0]]
    engine.dispose()

    pages = time_pages(settings, ROWS, newest)  # raises for a page that does not answer 200
    print(json.dumps({"seeded": seeded, "plans": plans, "pages": {
        n: {"median_ms": p["median_ms"], "first_ms": p["first_ms"]} for n, p in pages["pages"].items()}}, indent=1))

    # The day's charts of this ledger, for the docs.
    with running_console(settings, sample_every_s=5) as console, chromium() as driver:
        driver.get(console.url + "/?window=day")
        eventually(lambda: driver.find_elements(By.CSS_SELECTOR, "#throughput-chart rect.bar"), timeout_s=60,
                   what="the day's throughput")
        chart_screenshot(driver, "console-charts-day-2m")
