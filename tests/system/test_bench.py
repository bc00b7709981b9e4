"""`lapse bench`: a smoke run on the session's Apache Kafka and PostgreSQL checks the result's
shape and its correctness figures (not speeds); the full benchmark runs only with `-m bench`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

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


@pytest.mark.slow
def test_quick_bench_reports_every_stage_and_cleans_up(kafka_bootstrap, tmp_path):
    plot = tmp_path / "bench.png"
    out = run_bench(kafka_bootstrap, "--quick", "--events", "200", "--batch-sizes", "100",
                    "--plot", str(plot))

    for key in ("lapse_vs_naive", "lapse_vs_faust", "lapse_vs_limit", "lapse_1worker_vs_limit",
                "lapse_vs_copy", "lapse_1worker_events_per_s"):
        assert isinstance(out[key], RATE) and out[key] > 0, key
    assert out["events"] == 200 and out["partitions"] >= 2
    assert [r["batch_size"] for r in out["limit"]] == [100]
    assert isinstance(out["limit"][0]["events_per_s"], RATE)
    assert out["copy"]["rows"] == 200 and isinstance(out["copy"]["rows_per_s"], RATE)
    assert sorted(r["workers"] for r in out["lapse"]) == [1, 2]
    for run in out["lapse"]:
        assert isinstance(run["events_per_s"], RATE) and isinstance(run["startup_s"], RATE)
        assert run["released"] == 200 and run["offsets_committed"] is True
    for stage in ("naive", "faust"):
        assert out[stage]["events"] > 0 and isinstance(out[stage]["events_per_s"], RATE)
    latency = out["latency"]
    for key in ("p50_ms", "p95_ms", "p99_ms", "observed_p99_ms", "offered_events_per_s"):
        assert isinstance(latency[key], RATE), key
    assert latency["p50_ms"] <= latency["p95_ms"] <= latency["p99_ms"]
    assert "latencies_ms" not in latency
    assert out["reconciler_scan"]["rows"] >= 20_000 and isinstance(out["reconciler_scan"]["rows_per_s"], RATE)
    assert out["audit_replay"]["records"] == 200
    assert set(out["targets_met"]) >= {"lapse_vs_naive", "lapse_vs_faust", "lapse_vs_limit", "latency_p99_ms"}
    assert all(isinstance(v, bool) for v in out["targets_met"].values())
    assert {"date", "cpus", "python"} <= set(out["machine"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench_databases(out["run_id"]) == []
    assert not list(Path.cwd().glob("bench-faust-*"))  # Faust's data dir stays out of the work tree


@pytest.mark.bench
def test_full_bench(kafka_bootstrap, request):
    """The real benchmark (about two minutes): `pytest -m bench tests/system/test_bench.py -s`."""
    if "bench" not in (request.config.getoption("-m") or ""):
        pytest.skip("the full benchmark runs only when selected with -m bench")
    out = run_bench(kafka_bootstrap, "--events", "20000")
    print(json.dumps(out, indent=2, sort_keys=True))
    assert all(run["offsets_committed"] for run in out["lapse"])
