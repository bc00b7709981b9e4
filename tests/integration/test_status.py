"""`lapse status` on a real ledger and broker: a stuck claim and the oldest eligible operation
age as a fake clock advances; consumer lag in records and seconds."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event, pending_row
from lapse.kernel.models import cleanup_ledger
from lapse.readers.status import status_report
from lapse.shell.app import main
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.readers import READER_TOPICS, produce_events


def _row(subject: str, state: str, due_at: datetime, now: datetime, **extra) -> dict:
    event = expiry_event("release-reservation", subject, "t1", due_at, source="sweep", correlation_id=f"c-{subject}")
    base = {"claim_owner": None, "claim_until": None, "finished_at": None}
    return {**pending_row(event, now), **base, "state": state, **extra}


def test_status_shows_a_stuck_claim_and_ages_rising_with_the_clock(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    engine = make_engine(pg_url)
    produce_events(settings, [expiry_event("release-reservation", i, "t1", datetime.now(UTC), source="sweep",
                                           correlation_id="c") for i in range(4)])
    t0 = datetime.now(UTC) + timedelta(seconds=1)  # the fake clock, after the records' timestamps
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), [
            _row("1", "claimed", t0 - timedelta(minutes=10), t0, claim_owner="gone-worker",
                 claim_until=t0 - timedelta(minutes=2)),
            _row("2", "pending", t0 - timedelta(minutes=5), t0),
            _row("3", "pending", t0 + timedelta(hours=1), t0),
            _row("4", "applied", t0 - timedelta(minutes=30), t0, finished_at=t0),
            _row("5", "dead_letter", t0 - timedelta(minutes=30), t0, finished_at=t0),
        ])

    first = status_report(settings, engine, t0)
    later = status_report(settings, engine, t0 + timedelta(minutes=5))
    assert first["ledger"] == {s: {"release-reservation": n} for s, n in
                               {"applied": 1, "claimed": 1, "dead_letter": 1, "pending": 2}.items()}
    assert (first["oldest_eligible_age_s"], later["oldest_eligible_age_s"]) == (600, 900)
    assert first["expired_claims"] == {"count": 1, "oldest_expired_for_s": 120}
    assert later["expired_claims"] == {"count": 1, "oldest_expired_for_s": 420}
    assert first["dead_letters"] == 1
    key = (settings.topology.groups.cleanup, settings.topology.expiry)
    lag_now, lag_later = ({(r["group"], r["topic"]): r for r in s["lag"]}[key] for s in (first, later))
    assert (lag_now["records"], lag_later["records"]) == (4, 4)  # nothing consumed by the group
    assert lag_later["seconds"] - lag_now["seconds"] == pytest.approx(300, abs=0.01)

    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    result = CliRunner().invoke(main, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["ledger"] == first["ledger"] and shown["expired_claims"]["count"] == 1
    assert shown["oldest_eligible_age_s"] >= 600
    engine.dispose()
