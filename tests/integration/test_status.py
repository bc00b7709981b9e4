"""`lapse status` on a real ledger and broker: a stuck claim and the oldest eligible operation
age as a fake clock advances; consumer lag in records and seconds."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event, pending_row
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
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
    # Only groups that consume: cleanup, delay, analytics, archive; no phantom reports group lagging forever.
    groups = settings.topology.groups
    assert {r["group"] for r in first["lag"]} == {groups.cleanup, groups.delay, groups.analytics, groups.archive}
    assert not any("reports" in r["group"] for r in first["lag"])

    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    result = CliRunner().invoke(main, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["ledger"] == first["ledger"] and shown["expired_claims"]["count"] == 1
    assert shown["oldest_eligible_age_s"] >= 600
    engine.dispose()


def test_status_counts_eligible_work_left_per_kind(kafka_bootstrap, pg_url, unique):
    """Due, still-eligible business rows whose cleanup is not done (no ledger row, or an unfinished
    one) are the work left; done, not yet due and no longer eligible rows are not."""
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique)
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    hour = timedelta(hours=1)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [
            {"id": 1, "tenant": "t1", "status": "held", "expires_at": now - 3 * hour},  # no ledger row
            {"id": 2, "tenant": "t1", "status": "held", "expires_at": now - 2 * hour},  # pending row
            {"id": 3, "tenant": "t1", "status": "held", "expires_at": now - hour},      # skipped: done
            {"id": 4, "tenant": "t1", "status": "held", "expires_at": now + hour},      # not due
            {"id": 5, "tenant": "t1", "status": "released", "expires_at": now - hour},  # not eligible
        ])
        conn.execute(insert(cleanup_ledger), [
            _row("2", "pending", now - 2 * hour, now),
            _row("3", "skipped", now - hour, now, finished_at=now),
        ])
    report = status_report(settings, engine, now, lag=False)
    work = report["eligible"]["release-reservation"]
    assert (work["rows"], work["capped"]) == (2, False)
    assert work["oldest_due_age_s"] == pytest.approx(3 * 3600, abs=1)
    assert report["eligible"]["artifact-delete"] == {"rows": 0, "capped": False, "oldest_due_age_s": None}
    engine.dispose()


def test_the_alarm_counts_due_rows_no_sweep_has_emitted_and_the_outbox_backlog(kafka_bootstrap, pg_url, unique):
    """With 300 due rows and no sweep running there is no ledger row at all, yet the oldest eligible
    age is theirs; outbox rows not yet published are the backlog, aged by the oldest."""
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, with_delay_tiers=False)
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [
            {"id": i, "tenant": "t1", "status": "held", "expires_at": now - timedelta(minutes=i)}
            for i in range(1, 301)])
        conn.execute(insert(outbox), [
            {"topic": "o", "key": f"k{i}", "schema": "cleanup_outcome", "payload": {}, "headers": {},
             "created_at": now - timedelta(seconds=s), "sent_at": sent}
            for i, (s, sent) in enumerate([(90, now), (60, None), (30, None)])])
    report = status_report(settings, engine, now, lag=False)
    assert report["ledger"] == {}
    assert report["eligible"]["release-reservation"]["rows"] == 300
    assert report["oldest_eligible_age_s"] == pytest.approx(300 * 60, abs=1)
    assert report["outbox"] == {"unsent": 2, "oldest_unsent_age_s": pytest.approx(60, abs=0.01)}

    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    result = CliRunner().invoke(main, ["status", "--no-lag"], env=env)
    assert result.exit_code == 0, result.output
    # The command reads the real clock, a little after the report's `now`.
    assert re.search(r"oldest eligible unfinished: 180\d\ds", result.stdout), result.stdout
    assert re.search(r"outbox unsent: 2 \(oldest written \d+s ago\)", result.stdout), result.stdout
    engine.dispose()


def test_status_counts_the_rows_no_time_partition_covers_and_each_groups_members(kafka_bootstrap, pg_url, unique):
    """A transition and an outbox row stamped before every partition wait in DEFAULT: status
    counts them (and says what creates their partitions); no group consumes here, so each
    declared group has no members."""
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    engine = make_engine(pg_url)
    long_ago = datetime(2020, 1, 6, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(insert(ledger_transitions), [{"op_key": "release-reservation:1", "to_state": "pending",
                                                   "attempt": 0, "actor": "test", "at": long_ago}])
        conn.execute(insert(outbox), [{"topic": "t", "key": "k", "schema": "s", "payload": {}, "headers": {},
                                       "created_at": long_ago}])
    now = datetime.now(UTC)
    report = status_report(settings, engine, now)
    assert report["outside_partitions"] == {"lapse_transitions": 1, "lapse_outbox": 1}
    assert {r["group_state"].get("members") for r in report["lag"]} == {0}, report["lag"]
    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    text = CliRunner().invoke(main, ["status"], env=env)
    assert text.exit_code == 0, text.output
    assert "rows outside every time partition: lapse_transitions 1, lapse_outbox 1" in text.stdout
    assert f"lag {settings.topology.groups.cleanup} on {settings.topology.expiry}: 0 records, 0s (" in text.stdout
    engine.dispose()
