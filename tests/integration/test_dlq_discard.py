"""Operator discard of dead letters on PostgreSQL: selected, bounded, dry run first, confirmed,
audited (an operator action and a transition with actor and reason); a discarded operation is final:
never replayed, a late redelivery of its event is a duplicate, status counts it, and retention
removes it on the dead-letter horizon. The console's discard form: operator only, CSRF-checked."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import httpx
from click.testing import CliRunner
from sqlalchemy import func, select, text

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import ExpiryEvent, Selection, expiry_event
from lapse.kernel.models import cleanup_ledger, ledger_transitions, operator_actions, outbox
from lapse.kernel.settings import load_settings
from lapse.operator_actions import discard, replay
from lapse.processors import BatchScope, apply_batch
from lapse.readers.status import ledger_status
from lapse.retention.queries import count_prunable, prune_dead_letters
from lapse.shell.app import main
from tests.fixtures.console import running_console
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.topology import repo_topology

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TOPOLOGY = repo_topology()  # what the `lapse dlq` commands use with no prefix set
OPERATOR, VIEWER = ("alice", "op-token-7d2a5e91c04b"), ("victor", "view-token-3c9e80f1a62d")


def bad_event(i: int, tenant: str) -> ExpiryEvent:
    """A release-reservation with a non-numeric subject: dead-lettered as invalid at once."""
    return expiry_event("release-reservation", f"x{i}", tenant, NOW - timedelta(minutes=1), source="sweep",
                        correlation_id=f"c{i}")


def key(i: int) -> str:
    return f"release-reservation:x{i}"


def process(engine, events, now=NOW):
    with engine.begin() as conn:
        return apply_batch(BatchScope(conn, kinds=demo_kinds(conn), topics=TOPOLOGY, worker="w", now=now,
                                      lease=timedelta(seconds=30)), events)


def states(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(cleanup_ledger.c.op_key, cleanup_ledger.c.state)).all())


def test_cli_discard_needs_a_selection_and_a_reason_counts_asks_and_records(pg_url):
    engine = make_engine(pg_url)
    process(engine, [bad_event(i, "t1") for i in range(3)] + [bad_event(i, "t2") for i in range(3, 5)])
    runner = CliRunner()
    base = ["dlq", "discard", "--database-url", pg_url, "--log-level", "WARNING"]
    no_reason = runner.invoke(main, [*base, "--limit", "5", "--all", "--actor", "a"])
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output, no_reason.output
    blank = runner.invoke(main, [*base, "--limit", "5", "--all", "--actor", "a", "--reason", " "])
    assert blank.exit_code == 2 and "--reason must say why" in blank.output, blank.output
    unselected = runner.invoke(main, [*base, "--limit", "10000", "--reason", "oops", "--actor", "anyone"])
    assert unselected.exit_code == 2 and "say which dead letters to discard" in unselected.output
    both = runner.invoke(main, [*base, "--limit", "5", "--reason", "x", "--actor", "a", "--all", "--kind", "k"])
    assert both.exit_code == 2, both.output

    dry = runner.invoke(main, [*base, "--limit", "10", "--tenant", "t1", "--reason", "x", "--actor", "a",
                               "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == {
        "dry_run": True, "selection": "tenant=t1 (replayed ones included)", "limit": 10, "would_discard": 3,
        "op_keys": [key(i) for i in range(3)]}
    unasked = runner.invoke(main, [*base, "--limit", "10", "--all", "--reason", "x", "--actor", "a"])
    assert unasked.exit_code == 2 and unasked.output.startswith("lapse: Discard 5 dead letters (all"), unasked.output
    assert set(states(engine).values()) == {"dead_letter"}  # refusals and the dry run changed nothing
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(operator_actions)).scalar_one() == 0

    out = runner.invoke(main, [*base, "--limit", "10", "--op-key", key(0), "--op-key", key(3),
                               "--reason", "subject deleted upstream", "--actor", "bob", "--yes", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert sorted(r["op_key"] for r in data["discarded"]) == [key(0), key(3)] and data["actor"] == "bob"
    assert states(engine) == {key(0): "discarded", key(1): "dead_letter", key(2): "dead_letter",
                              key(3): "discarded", key(4): "dead_letter"}
    with engine.connect() as conn:
        (action,) = conn.execute(select(operator_actions)).mappings().all()
        user = conn.execute(text("SELECT current_user")).scalar_one()
        moves = conn.execute(select(ledger_transitions.c.op_key, ledger_transitions.c.actor,
                                    ledger_transitions.c.reason).where(
            ledger_transitions.c.from_state == "dead_letter", ledger_transitions.c.to_state == "discarded")
            .order_by(ledger_transitions.c.op_key)).all()
        finished = conn.execute(select(func.count()).select_from(cleanup_ledger).where(
            cleanup_ledger.c.state == "discarded", cleanup_ledger.c.finished_at.is_not(None))).scalar_one()
    assert (action["id"], action["action"], action["actor"], action["reason"], action["db_user"]) == (
        data["action_id"], "dlq_discard", "bob", "subject deleted upstream", user)
    assert action["details"] == {"discarded": 2, "limit": 10, "shown_before_confirming": 2,
                                 "op_keys": [key(0), key(3)]}
    assert moves == [(key(0), "bob", "subject deleted upstream"), (key(3), "bob", "subject deleted upstream")]
    assert finished == 2
    listed = json.loads(runner.invoke(main, ["dlq", "list", "--database-url", pg_url, "--no-poison",
                                             "--json"]).stdout)
    assert [r["op_key"] for r in listed["dead_letters"]] == [key(1), key(2), key(4)]

    # Replaying everything releases the dead letters left, never a discarded one.
    replayed = runner.invoke(main, ["dlq", "replay", "--database-url", pg_url, "--log-level", "WARNING",
                                    "--limit", "100", "--all", "--include-replayed", "--reason", "retry all",
                                    "--actor", "bob", "--yes", "--json"])
    assert replayed.exit_code == 0, replayed.output
    assert sorted(r["op_key"] for r in json.loads(replayed.stdout)["released"]) == [key(1), key(2), key(4)]
    assert states(engine)[key(0)] == states(engine)[key(3)] == "discarded"
    again = runner.invoke(main, [*base, "--limit", "10", "--op-key", key(0), "--reason", "x", "--actor", "a",
                                 "--yes"])
    assert again.exit_code == 0 and "nothing to discard" in again.output, again.output

    with engine.connect() as conn:
        status = ledger_status(conn, NOW + timedelta(hours=1))
    assert status["discarded"] == 2 and status["ledger"]["discarded"] == {"release-reservation": 2}
    assert status["dead_letters"] == 0
    engine.dispose()


def test_a_discarded_operation_is_final_a_redelivery_is_a_duplicate_and_it_is_pruned_with_dead_letters(pg_url):
    engine = make_engine(pg_url)
    process(engine, [bad_event(1, "t1"), bad_event(2, "t1")])
    later = NOW + timedelta(hours=1)
    with engine.begin() as conn:
        discarded = discard(conn, Selection(op_keys=(key(1),)), limit=10, reason="gone", actor="alice", now=later)
    assert [r["op_key"] for r in discarded] == [key(1)]
    with engine.connect() as conn:
        sent_before = conn.execute(select(func.count()).select_from(outbox)).scalar_one()

    with engine.connect() as conn:
        attempt = conn.execute(select(cleanup_ledger.c.attempt).where(cleanup_ledger.c.op_key == key(1))).scalar_one()
    # Late redeliveries: the original event, and a wake-up carrying the row's latest attempt.
    original = bad_event(1, "t1")
    result = process(engine, [original], now=later + timedelta(minutes=5))
    assert result.duplicates == 1 and not result.dead_lettered
    wake_up = expiry_event(original.kind, "x1", "t1", original.due_at, source="retry", correlation_id="c1",
                           attempt=attempt)
    result = process(engine, [wake_up], now=later + timedelta(minutes=6))
    assert result.duplicates == 1 and not result.dead_lettered
    with engine.connect() as conn:
        row = conn.execute(select(cleanup_ledger.c.state, cleanup_ledger.c.duplicates).where(
            cleanup_ledger.c.op_key == key(1))).one()
        assert conn.execute(select(func.count()).select_from(outbox)).scalar_one() == sent_before
    assert tuple(row) == ("discarded", 2)
    with engine.begin() as conn:  # a replay by its own op key finds nothing to release
        assert replay(conn, Selection(op_keys=(key(1),), include_replayed=True), limit=10, reason="x",
                      actor="alice", now=later, expiry_topic=TOPOLOGY.expiry)[1] == []

    # Retention: the discarded row goes on the dead-letter horizon, counted from its discard.
    with engine.begin() as conn:
        before_discard = count_prunable(conn, settled_cutoff=None, dead_letter_cutoff=later,
                                        transitions_cutoff=None, outbox_cutoff=NOW)
        assert before_discard["ledger_dead_letters"] == 1  # the dead letter (finished at NOW) only
        after = later + timedelta(seconds=1)
        counted = count_prunable(conn, settled_cutoff=None, dead_letter_cutoff=after,
                                 transitions_cutoff=None, outbox_cutoff=NOW)
        assert counted["ledger_dead_letters"] == 2
        assert prune_dead_letters(conn, after, 1) == 1  # the batch bound holds
        assert prune_dead_letters(conn, after, 10) == 1
        assert prune_dead_letters(conn, after, 10) == 0
    assert states(engine) == {}
    engine.dispose()


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def test_the_console_discards_after_its_dry_run_for_an_operator_only(pg_url):
    engine = make_engine(pg_url)
    process(engine, [bad_event(1, "t1"), bad_event(2, "t1")])
    settings = load_settings(database={"url": pg_url}, console={
        "operator_tokens": {OPERATOR[0]: OPERATOR[1]}, "viewer_tokens": {VIEWER[0]: VIEWER[1]}})
    with running_console(settings) as console:
        with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {VIEWER[1]}"}) as viewer:
            token = _csrf(viewer.get("/activity").text)
            refused = viewer.post("/dead-letters/discard/confirm",
                                  data={"csrf_token": token, "op_key": key(1), "reason": "viewer tries"})
            assert refused.status_code == 403 and "needs an operator token" in refused.text
        with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {OPERATOR[1]}"}) as operator:
            forged = operator.post("/dead-letters/discard/confirm", data={"op_key": key(1), "reason": "no token"})
            assert forged.status_code == 403 and "CSRF" in forged.text
            token = _csrf(operator.get("/activity").text)
            preview = operator.post("/dead-letters/discard", data={"csrf_token": token, "op_key": key(1)})
            assert preview.status_code == 200 and 'id="would-discard" data-value="1"' in preview.text
            assert set(states(engine).values()) == {"dead_letter"}  # the dry run changed nothing
            done = operator.post("/dead-letters/discard/confirm", data={
                "csrf_token": _csrf(preview.text), "op_key": key(1), "shown": "1", "reason": "not ours"})
            assert done.status_code == 303 and done.headers["location"].startswith("/actions/")
            shown = operator.get(done.headers["location"])
            assert shown.status_code == 200 and 'id="discarded">1<' in shown.text
    assert states(engine) == {key(1): "discarded", key(2): "dead_letter"}
    with engine.connect() as conn:
        (action,) = conn.execute(select(operator_actions)).mappings().all()
    assert (action["action"], action["actor"], action["reason"]) == ("dlq_discard", "alice", "not ours")
    assert action["details"]["via"] == "console" and action["details"]["op_keys"] == [key(1)]
    engine.dispose()
