"""`lapse soak`: a short run on the session's Apache Kafka and PostgreSQL reads the pipeline while
it works (lag, outbox, table sizes, throughput), prunes every seeded row (all past the horizon)
while the load runs, offers the whole mix, and drops its database afterwards. The 10-minute run
(`make soak`) is recorded in docs/performance.md; speeds are never asserted here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from lapse.devtools.soak.load import MIX
from lapse.shell.app import main
from tests.fixtures.db import admin_url


def soak_databases() -> list[str]:
    engine = create_engine(admin_url())
    with engine.connect() as conn:
        names = conn.execute(text("SELECT datname FROM pg_database WHERE datname LIKE 'lapse_bench_%_soak'")).all()
    engine.dispose()
    return [n for (n,) in names]


@pytest.mark.scale
@pytest.mark.slow
def test_a_short_soak_reads_the_pipeline_and_prunes_the_seeded_ledger(kafka_bootstrap):
    before = set(soak_databases())
    result = CliRunner().invoke(main, ["soak", "--bootstrap-servers", kafka_bootstrap, "--database-url", admin_url(),
                                       "--minutes", "0.35", "--rate", "50", "--seed-rows", "3000",
                                       "--sample-s", "3", "--json"])
    assert result.exit_code in (0, 1), result.output[-2000:]  # 1: not steady (too short to judge a minute)
    out = json.loads(result.stdout)

    assert len(out["samples"]) >= 5
    assert out["offered"]["events"] >= 50 * 18
    assert set(MIX) <= set(out["offered"])
    # Pruning ran while the load did: every seeded row (finished before the horizon) is gone.
    assert out["seeded_rows_left"] == 0
    # The pipeline kept up with 50 events/s: rows finished in every reading after the first.
    assert all(s["finished"] > 0 for s in out["samples"][1:])
    assert out["samples"][-1]["lag_records"] < 50 * 10
    assert set(out["checks"]) == {"lag_bounded", "outbox_bounded", "sizes_bounded", "throughput_held"}
    assert set(soak_databases()) == before  # its database was dropped
