"""Operator replay of dead letters on PostgreSQL: bounded, selected, confirmed, audited (an operator
action row with the database user), one replay id, never a loop."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import func, select, text

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import ExpiryEvent, Selection, expiry_event
from lapse.kernel.models import cleanup_ledger, ledger_transitions, operator_actions, outbox
from lapse.operator_actions import replay
from lapse.processors import BatchScope, apply_batch
from lapse.shell.app import main
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.topology import repo_topology

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TOPOLOGY = repo_topology()  # what the `lapse dlq` commands use with no prefix set


def bad_event(i: int, tenant: str) -> ExpiryEvent:
    """A release-reservation with a non-numeric subject: dead-lettered as invalid at once."""
    return expiry_event("release-reservation", f"x{i}", tenant, NOW - timedelta(minutes=1), source="sweep",
                        correlation_id=f"c{i}")


def process(engine, events, now=NOW):
    with engine.begin() as conn:
        return apply_batch(BatchScope(conn, kinds=demo_kinds(conn), topics=TOPOLOGY, worker="w", now=now,
                                      lease=timedelta(seconds=30)), events)


def replayed_events(engine, replay_id) -> list[ExpiryEvent]:
    with engine.connect() as conn:
        payloads = conn.execute(select(outbox.c.payload).where(
            outbox.c.topic == TOPOLOGY.expiry, outbox.c.headers["replay_id"].as_string() == replay_id)).scalars()
        return [expiry_event(p["kind"], p["subject_id"], p["tenant"], datetime.fromtimestamp(p["due_at"] / 1000, UTC),
                             source=p["source"], correlation_id=p["correlation_id"], attempt=p["attempt"],
                             replay_id=p["replay_id"]) for p in payloads]


def test_replay_releases_exactly_the_selection_once_and_failures_return_for_good(pg_url):
    engine = make_engine(pg_url)
    process(engine, [bad_event(i, "t-bad" if i % 10 == 0 else "t-ok") for i in range(100)])
    with engine.begin() as conn:
        replay_id, released = replay(conn, Selection(tenant="t-bad"), limit=50, reason="fixed parser",
                                     actor="alice", now=NOW + timedelta(hours=1), expiry_topic=TOPOLOGY.expiry)
    assert sorted(r["op_key"] for r in released) == sorted(f"release-reservation:x{i}" for i in range(0, 100, 10))
    with engine.connect() as conn:
        rows = conn.execute(select(cleanup_ledger.c.state, cleanup_ledger.c.replay_id, func.count())
                            .group_by(cleanup_ledger.c.state, cleanup_ledger.c.replay_id)).all()
        audit = conn.execute(select(ledger_transitions.c.actor, ledger_transitions.c.reason)
                             .where(ledger_transitions.c.replay_id == replay_id)).all()
    assert sorted(rows) == [("dead_letter", None, 90), ("pending", replay_id, 10)]
    assert set(audit) == {("alice", "fixed parser")} and len(audit) == 10

    with engine.begin() as conn:  # the same selection again: nothing left to release
        assert replay(conn, Selection(tenant="t-bad"), limit=50, reason="again", actor="alice",
                      now=NOW + timedelta(hours=1), expiry_topic=TOPOLOGY.expiry)[1] == []

    events = replayed_events(engine, replay_id)
    assert len(events) == 10 and {e.source for e in events} == {"replay"}
    result = process(engine, events, now=NOW + timedelta(hours=2))  # still bad: back to the DLQ
    assert len(result.dead_lettered) == 10
    with engine.connect() as conn:
        states = conn.execute(select(cleanup_ledger.c.state).where(
            cleanup_ledger.c.replay_id == replay_id).distinct()).scalars().all()
        dlq = conn.execute(select(outbox.c.payload).where(
            outbox.c.topic == TOPOLOGY.dlq, outbox.c.key == "release-reservation:x10")
            .order_by(outbox.c.id)).scalars().all()
    assert states == ["dead_letter"]
    assert dlq[-1]["replay_id"] == replay_id and len(dlq[-1]["history"]) == 2  # both failures
    with engine.begin() as conn:  # failed replays stay dead: no loop without an explicit opt-in
        assert replay(conn, Selection(tenant="t-bad"), limit=50, reason="again", actor="alice",
                      now=NOW + timedelta(hours=3), expiry_topic=TOPOLOGY.expiry)[1] == []
    engine.dispose()


def _ledger_states(url) -> list[tuple[str, int]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(conn.execute(select(cleanup_ledger.c.state, func.count())
                                       .group_by(cleanup_ledger.c.state)).all())
    finally:
        engine.dispose()


def _actions(url) -> tuple[list[dict], str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(select(operator_actions)).mappings()]
            return rows, conn.execute(text("SELECT current_user")).scalar_one()
    finally:
        engine.dispose()


def test_cli_replay_needs_a_selection_shows_the_count_and_asks(pg_url):
    engine = make_engine(pg_url)
    process(engine, [bad_event(i, "t1") for i in range(3)] + [bad_event(i, "t2") for i in range(3, 5)])
    engine.dispose()
    runner = CliRunner()
    base = ["dlq", "replay", "--database-url", pg_url, "--log-level", "WARNING"]
    refused = runner.invoke(main, [*base, "--reason", "x"])
    assert refused.exit_code == 2 and "--limit" in refused.output
    # No selection: nothing released however large the limit.
    refused = runner.invoke(main, [*base, "--limit", "10000", "--reason", "oops", "--actor", "anyone"])
    assert refused.exit_code == 2 and "--all" in refused.output, refused.output
    both = runner.invoke(main, [*base, "--limit", "5", "--reason", "x", "--actor", "a", "--all", "--tenant", "t1"])
    assert both.exit_code == 2, both.output
    assert _ledger_states(pg_url) == [("dead_letter", 5)]

    dry = runner.invoke(main, [*base, "--limit", "10", "--tenant", "t1", "--reason", "x", "--actor", "a",
                               "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == {
        "dry_run": True, "selection": "tenant=t1", "limit": 10, "would_release": 3,
        "op_keys": [f"release-reservation:x{i}" for i in range(3)]}
    dry_all = runner.invoke(main, [*base, "--limit", "10", "--all", "--reason", "x", "--actor", "a", "--dry-run"])
    assert dry_all.stdout.startswith("dry run: would release 5 dead letters (all, limit 10)"), dry_all.output
    # Without a terminal and without --yes: refused in one line, after saying how many.
    unasked = runner.invoke(main, [*base, "--limit", "10", "--all", "--reason", "x", "--actor", "a"])
    assert unasked.exit_code == 2, unasked.output
    assert unasked.output.startswith("lapse: Release 5 dead letters (all, limit 10)")
    assert unasked.output.count("\n") == 1 and "--yes" in unasked.output
    assert _ledger_states(pg_url) == [("dead_letter", 5)]
    assert _actions(pg_url)[0] == []

    out = runner.invoke(main, [*base, "--limit", "2", "--tenant", "t1", "--reason", "ticket 7", "--actor", "bob",
                               "--yes", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert len(data["released"]) == 2 and data["replay_id"].startswith("replay-") and data["actor"] == "bob"
    assert _ledger_states(pg_url) == [("dead_letter", 3), ("pending", 2)]
    actions, user = _actions(pg_url)
    assert [(a["action"], a["actor"], a["reason"], a["db_user"], a["target"]) for a in actions] == [
        ("dlq_replay", "bob", "ticket 7", user, "tenant=t1")]
    assert actions[0]["details"] == {"replay_id": data["replay_id"], "released": 2, "limit": 2,
                                     "shown_before_confirming": 2,
                                     "op_keys": [r["op_key"] for r in data["released"]]}
    listed = json.loads(runner.invoke(main, ["dlq", "list", "--database-url", pg_url, "--no-poison",
                                             "--json"]).stdout)
    assert [r["op_key"] for r in listed["dead_letters"]] == [
        "release-reservation:x2", "release-reservation:x3", "release-reservation:x4"]
