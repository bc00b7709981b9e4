"""How fast the operator console renders its pages on a big ledger: PostgreSQL seeds the stage's
ledger from `generate_series` (finished rows spread over the last day, each with its transition,
and every DEAD_EVERY-th a dead letter with its three failed attempts over the 75 minutes of the
retry tiers), then the console application runs in-process and each page is rendered a few times;
a page's figure is its median render, end to end (routing, every query, the broker's lag for the
overview, the template). Its first, cold render is reported beside it."""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

from sqlalchemy import Engine, text

from lapse.kernel.database import engine_from_settings, qualified_name
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.kernel.settings import Settings

SEED_CHUNK = 250_000  # rows per statement: one transaction per chunk keeps WAL and locks bounded
SPAN = timedelta(days=1)  # finish times spread over the day before the run: 2,000,000 rows ≈ 83,000 an hour
DEAD_EVERY = 500  # every 500th row is a dead letter (4,000 in 2,000,000)
RECENT_DEAD = 87_000  # a dead letter (a multiple of DEAD_EVERY) finished 600 s before the newest row
RENDERS = 5  # renders per page the median is taken of, after a first (cold) one
KIND = "release-reservation"

_LEDGER = """
INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at, last_failure_class,
    last_failure, correlation_id, source, duplicates, created_at, updated_at, finished_at)
SELECT 'release-reservation:console-' || g, 'release-reservation', 'tenant-' || (g % 7), 'console-' || g,
       CASE WHEN dead THEN 'dead_letter' ELSE 'applied' END, CASE WHEN dead THEN 3 ELSE 1 END,
       t - life, CASE WHEN dead THEN (ARRAY['transient', 'permanent'])[1 + g % 2] END,
       CASE WHEN dead THEN 'seeded failure' END, md5(g::text), 'sweep', 0, t - life, t, t
FROM (SELECT g, g % :dead_every = 0 AS dead,
             CASE WHEN g % :dead_every = 0 THEN interval '75 minutes' ELSE interval '30 seconds' END AS life,
             CAST(:newest AS timestamptz) - make_interval(secs => (g % :span_s)) AS t
      FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g) AS s
"""
_TRANSITIONS = """
INSERT INTO {transitions} (op_key, from_state, to_state, attempt, failure_class, reason, actor,
    correlation_id, at)
SELECT 'release-reservation:console-' || g, from_state, to_state, attempt, failure_class, reason,
       'bench-seed', md5(g::text), at
FROM (SELECT g, g % :dead_every = 0 AS dead,
             CAST(:newest AS timestamptz) - make_interval(secs => (g % :span_s)) AS t
      FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g) AS s,
LATERAL (VALUES (NULL, 'applied', 1, NULL, NULL, t, NOT dead),
                (NULL, 'pending', 0, NULL, NULL, t - interval '75 minutes', dead),
                ('claimed', 'retry_scheduled', 1, 'transient', 'seeded failure', t - interval '74 minutes', dead),
                ('claimed', 'retry_scheduled', 2, 'transient', 'seeded failure', t - interval '62 minutes', dead),
                ('claimed', 'dead_letter', 3, (ARRAY['transient', 'permanent'])[1 + g % 2], 'seeded failure',
                 t, dead)) AS v(from_state, to_state, attempt, failure_class, reason, at, wanted)
WHERE wanted
"""


def seed_console_ledger(engine: Engine, rows: int, newest: datetime) -> dict[str, int]:
    """Insert `rows` finished ledger rows (every DEAD_EVERY-th a dead letter with three failed
    attempts, the others applied with one transition) finished over SPAN before `newest`; ANALYZE."""
    span_s = int(SPAN.total_seconds())
    with engine.connect() as conn:
        ledger, transitions = qualified_name(conn, cleanup_ledger), qualified_name(conn, ledger_transitions)
    for first in range(1, rows + 1, SEED_CHUNK):
        params = {"first": first, "last": min(rows, first + SEED_CHUNK - 1), "newest": newest, "span_s": span_s,
                  "dead_every": DEAD_EVERY}
        with engine.begin() as conn:
            conn.execute(text(_LEDGER.format(ledger=ledger)), params)
            conn.execute(text(_TRANSITIONS.format(transitions=transitions)), params)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"ANALYZE {ledger}"))
        conn.execute(text(f"ANALYZE {transitions}"))
        seeded = conn.execute(text(f"SELECT count(*) FROM {transitions}")).scalar_one()
    return {"rows": rows, "dead_letters": rows // DEAD_EVERY, "transitions": seeded}


def console_pages(settings: Settings, rows: int, progress: Callable[[str], None] = lambda _msg: None
                  ) -> dict[str, Any]:
    """Seed the stage's ledger with `rows` rows, then time each console page (median of RENDERS)."""
    newest = datetime.now(UTC) - timedelta(seconds=1)
    engine = engine_from_settings(settings)
    try:
        started = time.perf_counter()
        seeded = seed_console_ledger(engine, rows, newest)
        seed_s = round(time.perf_counter() - started, 1)
    finally:
        engine.dispose()
    progress(f"seeded {rows:,} ledger rows in {seed_s}s; rendering each page {RENDERS + 1} times")
    return {**seeded, "seed_s": seed_s, **time_pages(settings, rows, newest)}


def time_pages(settings: Settings, rows: int, newest: datetime) -> dict[str, Any]:
    """Render each page RENDERS + 1 times on the seeded ledger: the first render (cold: nothing
    cached by the console or the database) and the median of the others."""
    # A dead letter that finished in the last hour (the seed's row g finished g % SPAN seconds before
    # `newest`), its 75 minutes of transitions among the busiest; and its correlation id.
    g = RECENT_DEAD if rows >= RECENT_DEAD else DEAD_EVERY * 2
    op_key = f"{KIND}:console-{g}"
    since = (newest - timedelta(hours=6)).isoformat()
    pages = {
        "overview": "/",
        "dead_letters": "/dead-letters",
        "dead_letters_filtered": "/dead-letters?" + urlencode(
            {"kind": KIND, "tenant": f"tenant-{g % 7}", "failure_class": "transient", "since": since}),
        "overview_day": "/?window=day",
        "dead_letters_page_2": "/dead-letters?" + urlencode(
            {"after_at": (newest - timedelta(hours=12)).isoformat(), "after_key": f"{KIND}:console-0"}),
        "operation": f"/operations/{quote(op_key, safe='')}",
        "search_op_key": "/search?" + urlencode({"q": op_key}),
        "search_correlation_id": "/search?" + urlencode({"q": _md5(g)}),
        "search_business_id": "/search?" + urlencode({"kind": KIND, "subject": f"console-{g}"}),
        "tenant_operations": "/search?" + urlencode({"tenant": f"tenant-{g % 7}", "kind": KIND}),
        "activity": "/activity",
        "api_overview": "/api/v1/overview",
        "api_dead_letters": "/api/v1/dead-letters",
    }

    # function-local: the console is the optional `console` extra; only this stage needs it
    from starlette.testclient import TestClient

    from lapse.shell.console.app import create_app

    timed: dict[str, dict[str, Any]] = {}
    # No sampling thread: the first overview reads the day's transitions itself (its cold figure).
    app = create_app(settings.with_(console={"bind": "127.0.0.1"}), sample_every_s=0)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for name, path in pages.items():
            runs = []
            for _ in range(RENDERS + 1):
                t0 = time.perf_counter()
                response = client.get(path)
                runs.append(round((time.perf_counter() - t0) * 1000, 1))
                if response.status_code != 200:
                    raise RuntimeError(f"console page {path} answered {response.status_code}")
            timed[name] = {"path": path, "median_ms": statistics.median(runs[1:]), "first_ms": runs[0],
                           "runs_ms": runs[1:]}
    worst = max(timed, key=lambda n: timed[n]["median_ms"])
    return {"pages": timed, "worst_page": worst, "worst_ms": timed[worst]["median_ms"],
            "method": f"in-process console; median of {RENDERS} renders after a first (cold) one"}


def _md5(g: int) -> str:
    """The correlation id the seed gave row `g` (PostgreSQL's md5 of its number)."""
    return hashlib.md5(str(g).encode()).hexdigest()
