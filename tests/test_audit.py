"""`lapse audit` over a real history (sweep, worker, relay on Apache Kafka and PostgreSQL):
its counts match the ledger, and a forged second `applied` outcome fails the exit status."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import func, select, update

from lapse.cli import main
from lapse.database import make_engine
from lapse.demo_data import add_reservations
from lapse.ledger import ExpiryEvent
from lapse.models import cleanup_ledger, outbox, reservations
from tests.reader_env import (
    outcome_record,
    process_until_terminal,
    produce_events,
    produce_outcomes,
    reader_settings,
    relay,
    sweep,
)


def _event(subject: str, **kw) -> ExpiryEvent:
    return ExpiryEvent(op_key=f"release-reservation:{subject}", kind="release-reservation",
                       tenant="t1", subject_id=subject, due_at=datetime.now(UTC) - timedelta(minutes=5),
                       correlation_id=f"c-{subject}", **kw)


def _audit(settings, *args) -> tuple[int, dict]:
    env = {"LAPSE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "LAPSE_EXPIRY_TOPIC": settings.expiry_topic, "LAPSE_OUTCOMES_TOPIC": settings.outcomes_topic,
           "LAPSE_DLQ_TOPIC": settings.dlq_topic, "LAPSE_LOG_LEVEL": "WARNING"}
    result = CliRunner().invoke(main, ["audit", "--from-beginning", "--grace", "0s", "--json", *args],
                                env=env)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout.splitlines()[-1])


def test_audit_matches_the_ledger_and_fails_on_a_second_applied(kafka_bootstrap, pg_url, unique):
    settings = reader_settings(kafka_bootstrap, pg_url, unique)
    engine = make_engine(pg_url)
    past = datetime.now(UTC) - timedelta(minutes=10)
    with engine.begin() as conn:
        ids = add_reservations(conn, 8, expires_at=past)
    sweep(settings)
    with engine.begin() as conn:  # two payments win the race after the events were emitted
        conn.execute(update(reservations).where(reservations.c.id.in_(ids[:2])).values(status="paid"))
        (replayed,) = add_reservations(conn, 1, expires_at=past)
    # Faults: a duplicate delivery, an invalid subject (dead letter), an operator replay.
    produce_events(settings, [_event(str(ids[3])), _event("not-a-number"),
                              _event(str(replayed), source="replay", replay_id="replay-1")])
    process_until_terminal(settings, expected=10)
    relay(settings)
    with engine.begin() as conn:  # the relay crashed after the flush: one outcome goes out again
        conn.execute(update(outbox).where(outbox.c.id == 1).values(sent_at=None))
    assert relay(settings) == 1

    code, report = _audit(settings)
    with engine.connect() as conn:
        states = dict(conn.execute(select(cleanup_ledger.c.state, func.count())
                                   .group_by(cleanup_ledger.c.state)).all())
    assert states == {"applied": 7, "skipped": 2, "dead_letter": 1}
    assert (code, report["broken"]) == (0, [])
    assert report["final_by_status"] == states
    assert report["outcomes_by_status"] == states
    assert (report["events_seen"], report["op_keys_seen"]) == (11, 10)
    assert report["outcome_repeats"] == 1
    assert (report["without_terminal"], report["applied_twice"]) == (0, {})
    assert (report["dead_letters"], report["unresolved_dead_letters"]) == (1, 1)
    assert report["unresolved_sample"] == ["release-reservation:not-a-number"]
    assert report["replays"] == {"replay-1": {"events": 1, "outcome:applied": 1}}
    assert report["gaps"] == []

    # A second `applied` outcome for one op key, with its own outcome id: a broken invariant.
    produce_outcomes(settings, [outcome_record(10_000, str(ids[4]), worker="hand")])
    code, report = _audit(settings)
    assert code == 1
    assert list(report["applied_twice"]) == [f"release-reservation:{ids[4]}"]
    assert report["broken"] == ["1 op keys applied more than once"]
    engine.dispose()
