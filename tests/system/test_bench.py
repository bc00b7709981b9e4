"""`lapse bench`: a smoke run on the session's Apache Kafka and PostgreSQL checks the result's
shape and its correctness figures (not speeds); the full benchmark runs only with `-m bench`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, select, text

from lapse.devtools.bench.bound import SetBasedSql, batch_row, write_batch
from lapse.devtools.bench.databases import seed_held
from lapse.devtools.bench.end_state import verify_end_state
from lapse.devtools.bench.events import reservation_event
from lapse.devtools.bench.lean import LeanSql, apply_many, apply_one, driver_connection
from lapse.devtools.bench.report import summarize
from lapse.devtools.bench.runner import fastest_run
from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import engine_from_settings, qualified_name
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.settings import load_settings
from lapse.shell.app import main
from tests.fixtures.db import admin_url

RATE = (int, float)


def run_bench(kafka_bootstrap: str, *args: str) -> dict:
    result = CliRunner().invoke(main, ["bench", "--bootstrap-servers", kafka_bootstrap,
                                       "--database-url", admin_url(), "--json", *args])
    assert result.exit_code == 0, result.output[-2000:]
    return json.loads(result.stdout)


def bench_databases(run_id: str) -> list[str]:
    engine = create_engine(admin_url())
    with engine.connect() as conn:
        names = conn.execute(text("SELECT datname FROM pg_database WHERE datname LIKE :p"),
                             {"p": f"lapse_bench_{run_id}_%"}).scalars().all()
    engine.dispose()
    return names


@pytest.mark.scale
@pytest.mark.slow
def test_quick_bench_reports_every_stage_and_cleans_up(kafka_bootstrap, tmp_path):
    plot = tmp_path / "bench.png"
    out = run_bench(kafka_bootstrap, "--quick", "--events", "200", "--batch-sizes", "100",
                    "--plot", str(plot))

    # Every baseline and every Lapse run reached the same end state (business rows released,
    # ledger rows applied, one outcome per op key in the outbox), so every ratio counts.
    for stage in ("quix", "naive", "faust", "batched_naive", "db_bound"):
        assert out[stage]["verified"] is True, (stage, out[stage].get("reason"))
        assert out[stage]["reason"] is None
        assert out[stage]["events"] > 0 and isinstance(out[stage]["events_per_s"], RATE)
    assert out["batched_naive"]["events"] == 200
    assert out["unverified"] == []
    for key in ("lapse_vs_limit", "lapse_vs_quix", "batch_vs_db_bound", "lapse_vs_consumer", "lapse_vs_naive",
                "lapse_vs_faust", "lapse_vs_batched_naive", "lapse_2w_vs_1w", "relay_vs_lapse",
                "lapse_1worker_events_per_s", "limit_events_per_s"):
        assert isinstance(out[key], RATE) and out[key] > 0, key
    # The relay stage published every outbox row once: none left unsent, one record each on the topic.
    assert out["relay"]["verified"] is True, out["relay"]["reason"]
    assert out["relay"]["rows"] == 200 and isinstance(out["relay"]["rows_per_s"], RATE)
    for gone in ("lapse_vs_copy", "copy"):
        assert gone not in out
    assert out["events"] == 200 and out["partitions"] >= 2
    assert [r["batch_size"] for r in out["transaction_alone"]] == [100]
    assert isinstance(out["transaction_alone"][0]["events_per_s"], RATE)
    assert out["transaction_alone"][0]["verified"] is True, out["transaction_alone"][0]["reason"]
    assert out["db_bound"]["events"] == 200 and out["quix"]["events"] == 200
    assert len(out["db_bound"]["runs_events_per_s"]) == 1  # a quick run runs each compared stage once
    assert out["consumer"]["events"] == 200 and isinstance(out["consumer"]["events_per_s"], RATE)
    assert out["decode"]["events"] == 200 and out["decode"]["ratio"] == round(
        out["decode"]["decode_us"] / out["decode"]["fastavro_us"], 2)
    # One worker from a waiting backlog (the figure every ratio takes), then one and two joined first.
    assert [(r["workers"], r.get("joined_first", False)) for r in out["lapse"]] == [(1, False), (1, True), (2, True)]
    for run in out["lapse"]:
        assert isinstance(run["events_per_s"], RATE) and isinstance(run["startup_s"], RATE)
        assert run["released"] == 200 and run["offsets_committed"] is True
        assert run["verified"] is True, run["reason"]
    latency = out["latency"]
    for key in ("p50_ms", "p95_ms", "p99_ms", "observed_p99_ms", "offered_events_per_s"):
        assert isinstance(latency[key], RATE), key
    assert latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"]
    assert "latencies_ms" not in latency
    assert out["reconciler_scan"]["rows"] >= 20_000 and isinstance(out["reconciler_scan"]["rows_per_s"], RATE)
    assert out["audit_replay"]["records"] == 200
    # Every console page rendered (200) on a small seeded ledger; the 2,000,000-row figure is the full bench's.
    pages = out["console_pages"]
    assert pages["rows"] == 20_000 and pages["dead_letters"] > 0
    assert set(pages["pages"]) == {"overview", "overview_day", "dead_letters", "dead_letters_filtered",
                                   "dead_letters_page_2", "operation", "search_op_key", "search_correlation_id",
                                   "search_business_id", "tenant_operations", "activity", "api_overview",
                                   "api_dead_letters"}
    assert all(isinstance(p["median_ms"], RATE) for p in pages["pages"].values())
    # The fairness figure, measured once each way on a small backlog (the 100,000-row one is the full bench's).
    fair = out["fairness"]
    assert (fair["backlog"], fair["small_rows"], fair["repeats"]) == (1000, 400, 1)
    assert isinstance(fair["ratio"], RATE) and isinstance(fair["backlog_rows_per_s"], RATE)
    assert set(out["targets_met"]) >= {"lapse_vs_limit", "lapse_vs_quix", "batch_vs_db_bound", "lapse_2w_vs_1w",
                                       "relay_vs_lapse", "latency_p99_ms", "decode_vs_fastavro", "console_page_ms",
                                       "fairness_ratio"}
    assert not {"lapse_vs_naive", "lapse_vs_faust", "lapse_vs_batched_naive"} & set(out["targets_met"])
    assert all(isinstance(v, bool) for v in out["targets_met"].values())
    assert {"date", "cpus", "python"} <= set(out["machine"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench_databases(out["run_id"]) == []
    assert not list(Path.cwd().glob("bench-faust-*"))  # Faust's data dir stays out of the work tree


@pytest.fixture
def lean_db(pg_url):
    """A migrated database with 10 held reservations past due, its settings, the engine and the
    lean statements; events for reservations 1..10."""
    settings = load_settings(database={"url": pg_url})
    engine = engine_from_settings(settings)
    due = datetime.now(UTC) - timedelta(minutes=5)
    seed_held(engine, 10, due)
    yield settings, engine, LeanSql.for_engine(engine), [reservation_event(i, due) for i in range(1, 11)]
    engine.dispose()


@pytest.mark.parametrize("path", ["one", "many"])
def test_the_lean_baseline_statements_reach_lapse_end_state(lean_db, path):
    settings, engine, sql, events = lean_db
    outcomes = settings.topology.outcomes
    raw, conn = driver_connection(engine)
    try:
        for _ in range(2):  # a redelivery of everything is a duplicate: nothing more is written
            now = datetime.now(UTC)
            if path == "one":
                for event in events:
                    apply_one(conn, sql, event, worker="t", outcomes_topic=outcomes, now=now)
            else:
                apply_many(conn, sql, events + events[:3], worker="t", outcomes_topic=outcomes, now=now)
            conn.commit()
    finally:
        raw.close()
    assert verify_end_state(settings, events) == {"verified": True, "reason": None}


def test_the_bound_sql_releases_once_and_records_what_it_could_not_release_as_skipped(lean_db):
    """The database bound's (and the Quix peer's) set-based SQL: a batch with a duplicate of work
    done before and a reservation paid meanwhile releases the rest once, and records the paid one
    skipped, with its transition and outcome."""
    settings, engine, _, events = lean_db
    sql = SetBasedSql.for_names(qualified_name(engine, cleanup_ledger), qualified_name(engine, ledger_transitions),
                                qualified_name(engine, outbox), qualified_name(engine, reservations))
    with engine.begin() as c:
        c.execute(text("UPDATE reservations SET status = 'paid' WHERE id = 10"))
    raw, conn = driver_connection(engine)
    try:
        with conn.cursor() as cur:
            cur.execute(sql.create_batch)
            for batch in (events[:5], events):  # the second batch repeats the first five
                write_batch(cur, sql, [batch_row(e, "t", 0, i) for i, e in enumerate(batch)], "w",
                            settings.topology.outcomes)
                conn.commit()
    finally:
        raw.close()
    with engine.connect() as c:
        states = dict(c.execute(select(cleanup_ledger.c.op_key, cleanup_ledger.c.state)).all())
        steps = sorted(c.execute(select(ledger_transitions.c.op_key, ledger_transitions.c.to_state)).all())
        outcomes = sorted((k, p["status"]) for k, p in c.execute(select(outbox.c.key, outbox.c.payload)))
    expected = {e.op_key: "applied" for e in events[:9]} | {events[9].op_key: "skipped"}
    assert states == expected
    assert steps == sorted(expected.items()) and outcomes == sorted(expected.items())


def test_end_state_verification_names_what_is_missing(lean_db):
    settings, engine, sql, events = lean_db
    raw, conn = driver_connection(engine)
    try:
        apply_many(conn, sql, events, worker="t", outcomes_topic=settings.topology.outcomes, now=datetime.now(UTC))
        conn.commit()
    finally:
        raw.close()
    assert verify_end_state(settings, events[:9])["reason"].startswith("1 reservations released without an event")
    box, ledger = qualified_name(engine, outbox), qualified_name(engine, cleanup_ledger)
    with engine.begin() as c:
        c.execute(text(f"INSERT INTO {box} (topic, key, schema, payload, headers, created_at)"
                       f" SELECT topic, key, schema, payload, headers, created_at FROM {box} WHERE key = :k"),
                  {"k": events[0].op_key})
    assert "other than one outcome row" in verify_end_state(settings, events)["reason"]
    with engine.begin() as c:
        c.execute(text(f"DELETE FROM {box} WHERE key = :k"), {"k": events[0].op_key})
    assert "no outcome in the outbox" in verify_end_state(settings, events)["reason"]
    with engine.begin() as c:
        c.execute(text(f"UPDATE {ledger} SET state = 'claimed', finished_at = NULL WHERE op_key = :k"),
                  {"k": events[1].op_key})
    assert "not applied and finished" in verify_end_state(settings, events)["reason"]
    with engine.begin() as c:
        c.execute(text("UPDATE reservations SET status = 'held' WHERE id = 3"))
    result = verify_end_state(settings, events)
    assert result["verified"] is False and result["reason"].startswith("1 of 10 reservations not released")


def test_a_compared_stage_counts_its_fastest_verified_run():
    def run(rate: float | None, verified: bool = True) -> dict:
        return {"events_per_s": rate, "verified": verified, "reason": None if verified else "boom"}

    best = fastest_run([run(900.0), run(1200.0, verified=False), run(1000.0)])
    assert (best["events_per_s"], best["runs_events_per_s"]) == (1000.0, [900.0, 1200.0, 1000.0])
    failed = fastest_run([run(None, verified=False), run(800.0, verified=False)])
    assert (failed["verified"], failed["reason"], failed["runs_events_per_s"]) == (False, "boom", [None, 800.0])


def test_an_unverified_stage_has_no_ratio_and_misses_its_target():
    def run(workers: int, rate: float, joined: bool = False) -> dict:
        return {"workers": workers, "batch_size": 500, "events_per_s": rate, "verified": True, "reason": None,
                **({"joined_first": True} if joined else {})}

    out = {"lapse": [run(1, 1000.0), run(1, 1100.0, True), run(2, 1650.0, True), run(3, 1760.0, True)],
           "consumer": {"events_per_s": 4000.0}, "decode": {"ratio": 1.4},
           "db_bound": {"events_per_s": 2000.0, "verified": True, "reason": None},
           "transaction_alone": [{**run(1, 1800.0), "batch_size": 500}],
           "quix": {"events_per_s": 500.0, "verified": True, "reason": None},
           "naive": {"events_per_s": 10.0, "verified": True, "reason": None},
           "faust": {"events_per_s": 20.0, "verified": False, "reason": "3 of 10 reservations not released"},
           "batched_naive": {"events_per_s": None, "verified": False, "reason": "the stage failed: boom"},
           "relay": {"rows_per_s": 2500.0, "verified": False, "reason": "12 left unsent"},
           "latency": {"p99_ms": 240.0}, "reconciler_scan": {"rows_per_s": 1.0},
           "audit_replay": {"records_per_s": 1.0}, "console_pages": {"worst_ms": 120.0},
           "fairness": {"met": False}}
    result = summarize(out, 500)
    # The limit: 1 / (1/4000 + 1/2000) = 1333.3 events/s.
    assert result["limit_events_per_s"] == 1333.3 and result["lapse_vs_limit"] == 0.75
    assert (result["lapse_vs_quix"], result["batch_vs_db_bound"], result["lapse_vs_naive"]) == (2.0, 0.9, 100.0)
    assert result["lapse_2w_vs_1w"] == 1.6  # the best run with two or more workers, over one, all joined first
    assert result["lapse_vs_faust"] is None and result["lapse_vs_batched_naive"] is None
    assert result["relay_vs_lapse"] is None  # 2.5 if its end state had been verified
    assert result["unverified"] == ["faust", "batched_naive", "relay"]
    met = result["targets_met"]
    assert met["lapse_vs_limit"] and met["lapse_vs_quix"] and met["batch_vs_db_bound"] and met["lapse_2w_vs_1w"]
    assert met["latency_p99_ms"] and met["decode_vs_fastavro"]
    assert met["console_page_ms"] and not met["relay_vs_lapse"] and not met["fairness_ratio"]
    out["relay"]["verified"] = True
    assert summarize(out, 500)["relay_vs_lapse"] == 2.5 and summarize(out, 500)["targets_met"]["relay_vs_lapse"]
    out["db_bound"]["verified"] = False  # no bound: no limit, and no ratio against it counts
    assert summarize(out, 500)["lapse_vs_limit"] is None and not summarize(out, 500)["targets_met"]["lapse_vs_limit"]
    for run_ in out["lapse"]:  # Lapse itself unverified: no ratio of it counts
        run_["verified"] = False
    assert all(summarize(out, 500)[k] is None for k in ("lapse_vs_quix", "lapse_vs_naive", "lapse_2w_vs_1w"))


@pytest.mark.bench
def test_full_bench(kafka_bootstrap, request):
    """The real benchmark (about two minutes): `pytest -m bench tests/system/test_bench.py -s`."""
    if "bench" not in (request.config.getoption("-m") or ""):
        pytest.skip("the full benchmark runs only when selected with -m bench")
    out = run_bench(kafka_bootstrap, "--events", "20000")
    print(json.dumps(out, indent=2, sort_keys=True))
    assert all(run.get("offsets_committed") for run in out["lapse"])
    assert out["unverified"] == []  # every cleanup stage reached the same end state (reasons printed above)
