"""Retention on PostgreSQL and SQLite: finished ledger rows older than their horizon are removed in
bounded batches, and sent outbox rows older than theirs; younger rows, unfinished rows (however
old) and unsent outbox rows stay; a dry run counts the same rows and changes nothing; a late
redelivery within the horizon still meets its row and is a duplicate. Transitions go with their
ledger row on SQLite, and by age after the history horizon on PostgreSQL, where they and the outbox
are time-partitioned: partitions are created ahead (rows waiting in DEFAULT move into them), old
ones dropped whole, an outbox partition with an unsent row or a recent send kept, a locked table
left for the next pass, DEFAULT's old rows deleted in batches."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

from click.testing import CliRunner
from sqlalchemy import event, insert, select

from lapse.devtools.demo_tables import reservations
from lapse.kernel.ledger import partitions as parts
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox, shadow_effects
from lapse.processors.rules import apply_batch
from lapse.retention import partitions as rotation
from lapse.retention import prune_dry_run, prune_once
from lapse.retention.horizons import HorizonRefused, horizons
from lapse.retention.queries import count_prunable
from lapse.shell.app import main
from tests.fixtures.fast_path import NOW, RELEASE, TENANT, engine_for, key, kinds_for, release_event, reservation, scope
from tests.fixtures.polling import eventually

DAY = 86_400.0
GRACE_S = 300.0
HORIZONS = horizons(expiry_topic="expiry", expiry_retention_ms=str(14 * 86_400_000), dlq_topic="dlq",
                    dlq_retention_ms=str(30 * 86_400_000), grace_s=GRACE_S, outbox_horizon_s=DAY)
SETTLED_S = 14 * DAY + GRACE_S
DEAD_S = 30 * DAY + GRACE_S
OLD = NOW - timedelta(seconds=SETTLED_S + 60)  # past the settled horizon
YOUNG = NOW - timedelta(seconds=SETTLED_S - 60)  # within it
ANCIENT = NOW - timedelta(seconds=DEAD_S + 60)  # past the dead-letter horizon too

# (subject, state, finished_at); unfinished rows are as old as the oldest, and stay.
ROWS = ([(i, "applied", OLD) for i in range(1, 8)] + [(i, "skipped", OLD) for i in range(8, 11)]
        + [(11, "applied", YOUNG), (12, "skipped", YOUNG), (13, "dead_letter", OLD), (14, "dead_letter", ANCIENT),
           (15, "pending", None), (16, "claimed", None), (17, "retry_scheduled", None)])
REMOVED_KEYS = {key(RELEASE, i) for i in [*range(1, 11), 14]}
# On PostgreSQL transitions go by age (the history horizon, here the dead-letter one): those of the
# dead letter past it and of the unfinished rows as old (what an operator gives up, see horizons.py).
HISTORY_GONE_KEYS = {key(RELEASE, i) for i in (14, 15, 16, 17)}


def on_postgresql(url: str) -> bool:
    return url.startswith("postgresql")


def ledger_row(subject: int, state: str, finished: datetime | None) -> dict[str, Any]:
    created = (finished or ANCIENT) - timedelta(minutes=1)
    return {"op_key": key(RELEASE, subject), "kind": RELEASE, "tenant": TENANT, "subject_id": str(subject),
            "state": state, "attempt": 1, "due_at": created, "correlation_id": f"c{subject}", "source": "sweep",
            "duplicates": 0, "created_at": created, "updated_at": finished or created, "finished_at": finished,
            "claim_owner": "w" if state == "claimed" else None,
            "claim_until": created + timedelta(seconds=30) if state == "claimed" else None}


def seed(engine) -> None:
    """ROWS with two transitions each (created, and finished or moved, at their row's times), and
    outbox rows: sent before the outbox horizon (3), sent within it (1), unsent and old (1)."""
    ledger = [ledger_row(*r) for r in ROWS]
    transitions = []
    for row in ledger:
        transitions.append({"op_key": row["op_key"], "from_state": None, "to_state": "pending", "attempt": 0,
                            "actor": "t", "at": row["created_at"]})
        transitions.append({"op_key": row["op_key"], "from_state": "pending", "to_state": row["state"],
                            "attempt": 1, "actor": "t", "at": row["updated_at"]})
    old_sent = NOW - timedelta(seconds=DAY + 60)
    outbox_rows = [{"topic": "o", "key": f"k{i}", "schema": "s", "payload": {}, "headers": {},
                    "created_at": old_sent, "sent_at": sent}
                   for i, sent in enumerate([old_sent] * 3 + [NOW - timedelta(seconds=60), None])]
    # Shadow records: two past the history horizon (the dead-letter one here), one within it.
    shadows = [{"op_key": key("shadow-kind", i), "kind": "shadow-kind", "tenant": TENANT, "subject_id": str(i),
                "at": at, "outcome": "apply", "would": {}} for i, at in ((1, ANCIENT), (2, ANCIENT), (3, OLD))]
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), ledger)
        conn.execute(insert(ledger_transitions), transitions)
        conn.execute(insert(outbox), outbox_rows)
        conn.execute(insert(shadow_effects), shadows)


def tables(engine) -> dict[str, list[Any]]:
    with engine.connect() as conn:
        return {
            "ledger": sorted(conn.execute(select(cleanup_ledger.c.op_key)).scalars()),
            "transitions": sorted(conn.execute(select(ledger_transitions.c.op_key, ledger_transitions.c.to_state)
                                               ).all()),
            "outbox": sorted(conn.execute(select(outbox.c.key)).scalars()),
            "shadow_effects": sorted(conn.execute(select(shadow_effects.c.op_key)).scalars()),
        }


def test_rows_past_their_horizon_go_in_batches_and_everything_else_stays(db_url):
    engine = engine_for(db_url)
    seed(engine)
    before = tables(engine)
    seen: list[tuple[str, int]] = []

    report = prune_once(engine, HORIZONS, NOW, batch_size=3, progress=lambda t, n: seen.append((t, n)))

    after = tables(engine)
    assert after["ledger"] == sorted(set(before["ledger"]) - REMOVED_KEYS)
    assert after["outbox"] == ["k3", "k4"]  # sent within the horizon, and the unsent one
    assert after["shadow_effects"] == [key("shadow-kind", 3)]  # within the history horizon
    # 10 settled rows in batches of 3 take 4 statements, the last short.
    assert [n for t, n in seen if t == "ledger_settled"] == [3, 6, 9, 10]
    if on_postgresql(db_url):
        # The seeded rows are older than any partition: in DEFAULT, whose rows past the history
        # horizon (30d 5m) go in batches; the removed settled rows' transitions stay until then.
        assert report.removed == {"ledger_settled": 10, "ledger_dead_letters": 1, "transitions": 8, "outbox": 3,
                                  "shadow_effects": 2}
        assert [n for t, n in seen if t == "transitions"] == [3, 6, 8]
        assert report.batches == 4 + 1 + 3 + 2 + 1
        assert after["transitions"] == [t for t in before["transitions"] if t[0] not in HISTORY_GONE_KEYS]
        assert set(report.partitions) == {"transitions", "outbox"}
    else:
        assert report.removed == {"ledger_settled": 10, "ledger_dead_letters": 1, "transitions": 22, "outbox": 3,
                                  "shadow_effects": 2}
        # 22 transitions take 8 statements.
        assert [n for t, n in seen if t == "transitions"] == [3, 6, 9, 12, 15, 18, 21, 22]
        assert report.batches == 4 + 1 + 8 + 2 + 1
        # Transitions of kept rows stay, however old (the unfinished rows' are older than any horizon).
        assert after["transitions"] == [t for t in before["transitions"] if t[0] not in REMOVED_KEYS]
        assert report.partitions == {}

    again = prune_once(engine, HORIZONS, NOW, batch_size=3)
    assert sum(again.removed.values()) == 0 and tables(engine) == after


def test_a_dry_run_counts_what_a_run_removes_and_changes_nothing(db_url):
    engine = engine_for(db_url)
    seed(engine)
    before = tables(engine)

    dry = prune_dry_run(engine, HORIZONS, NOW)

    assert tables(engine) == before
    assert dry.removed == prune_once(engine, HORIZONS, NOW, batch_size=1000).removed
    shown = dry.to_dict()
    transitions = 8 if on_postgresql(db_url) else 22
    assert shown["dry_run"] and shown["total"] == 10 + 1 + transitions + 3 + 2
    assert shown["tables"]["ledger_settled"]["horizon_s"] == SETTLED_S
    assert shown["tables"]["ledger_settled"]["reason"] == "expiry retention 14d + reconciler grace 5m"
    assert shown["tables"]["ledger_dead_letters"]["horizon_s"] == DEAD_S
    # PostgreSQL: transitions by the history horizon, the dead letters' by default.
    assert shown["tables"]["transitions"]["horizon_s"] == (DEAD_S if on_postgresql(db_url) else SETTLED_S)


def test_a_late_redelivery_within_the_horizon_meets_its_row_and_is_applied_once(db_url):
    engine, kinds = engine_for(db_url), kinds_for(db_url)
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(1), reservation(2)])
    with engine.begin() as conn:
        first = apply_batch(scope(conn, kinds), [release_event(1), release_event(2)])
    assert sorted(first.applied) == [key(RELEASE, 1), key(RELEASE, 2)]
    # Business row 2 is held again (a new hold of the same id): its event, redelivered, must not
    # release it a second time while its ledger row is kept.
    with engine.begin() as conn:
        conn.execute(reservations.update().where(reservations.c.id == 2).values(status="held", released_at=None))

    # Just inside the horizon: the pass keeps both rows.
    inside = prune_once(engine, HORIZONS, NOW + timedelta(seconds=SETTLED_S - 1), batch_size=10)
    assert inside.removed["ledger_settled"] == 0

    with engine.begin() as conn:
        late = apply_batch(scope(conn, kinds), [release_event(1, attempt=0), release_event(2, attempt=0)])
    assert late.applied == [] and late.duplicates == 2
    with engine.connect() as conn:
        assert conn.execute(select(reservations.c.status).where(reservations.c.id == 2)).scalar_one() == "held"
        applied = conn.execute(select(ledger_transitions.c.op_key).where(
            ledger_transitions.c.to_state == "applied")).scalars().all()
    assert sorted(applied) == [key(RELEASE, 1), key(RELEASE, 2)]  # one each: applied once

    # Past the horizon the rows go, and their transitions on SQLite (on PostgreSQL they are kept for
    # the history horizon); unsent outbox rows stay.
    past = prune_once(engine, HORIZONS, NOW + timedelta(seconds=SETTLED_S + 1), batch_size=10)
    assert past.removed["ledger_settled"] == 2
    assert past.removed["transitions"] == (0 if on_postgresql(db_url) else len(applied))
    assert tables(engine)["ledger"] == []


def test_the_command_prints_counts_and_reasons_and_refuses_a_short_horizon(sqlite_url):
    env = {"LAPSE_DATABASE__URL": sqlite_url}
    dry = CliRunner().invoke(main, ["prune", "--dry-run", "--json"], env=env)
    assert dry.exit_code == 0, dry.output
    shown = json.loads(dry.stdout)
    assert shown["dry_run"] and shown["total"] == 0
    assert "retention 14d + reconciler grace 5m" in shown["tables"]["ledger_settled"]["reason"]

    run = CliRunner().invoke(main, ["prune"], env=env)
    assert run.exit_code == 0 and "total removed 0 in 5 batches" in run.stdout, run.output

    short = CliRunner().invoke(main, ["prune", "--ledger-horizon", "1d"], env=env)
    assert short.exit_code == 3
    assert short.output.strip().count("\n") == 0 and "shorter than 14d 5m" in short.output, short.output


def test_every_prune_statement_searches_an_index_on_sqlite(sqlite_url):
    """SQLite's plans (PostgreSQL's, on 2,000,000 rows, are in tests/system/test_prune_plans.py): no
    statement scans a table; the applied and skipped rows through their partial index."""
    engine = engine_for(sqlite_url)
    seed(engine)
    statements: list[tuple[str, Any]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many):
        if not statement.startswith("BEGIN"):
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        prune_once(engine, HORIZONS, NOW, batch_size=3)
        with engine.connect() as conn:
            count_prunable(conn, settled_cutoff=NOW, dead_letter_cutoff=NOW, transitions_cutoff=NOW,
                           outbox_cutoff=NOW, shadow_cutoff=NOW)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    plans = {}
    with engine.connect() as conn:
        for statement, parameters in statements:
            plans[statement] = [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)]
    # applied, skipped, dead letters, discarded (by their transitions), transitions (the first batch and
    # those after), outbox, shadow records; six counts
    assert len(plans) == 2 + 1 + 1 + 2 + 1 + 1 + 6
    for statement, plan in plans.items():
        assert not [step for step in plan if step.startswith("SCAN")], (statement, plan)
    settled = [p for s, p in plans.items() if s.startswith("DELETE FROM main.lapse_ledger") and "'applied'" in s]
    assert settled and all("ix_lapse_ledger_settled_finished" in " ".join(p) for p in settled), plans


def test_the_prune_service_prunes_every_interval_until_stopped(sqlite_url, tmp_path):
    """`lapse prune --watch` (the prune role of `lapse run`) on the packaged horizons: the settled
    rows, all finished over 14 days before today, go; unfinished rows stay; SIGTERM stops it cleanly."""
    engine = engine_for(sqlite_url)
    seed(engine)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAPSE_")},
           "LAPSE_DATABASE__URL": sqlite_url}
    proc = subprocess.Popen([sys.executable, "-m", "lapse", "prune", "--watch", "--interval", "200ms"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def settled_left() -> list[str]:
            with engine.connect() as conn:
                return list(conn.execute(select(cleanup_ledger.c.op_key).where(
                    cleanup_ledger.c.state.in_(["applied", "skipped"]))).scalars())

        eventually(lambda: not settled_left(), timeout_s=30, what="settled rows pruned")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    unfinished = {key(RELEASE, i) for i in (15, 16, 17)}
    assert unfinished <= set(tables(engine)["ledger"])


# Time partitions (PostgreSQL) ---------------------------------------------------------------------

def outbox_row(name: str, created: datetime, sent: datetime | None) -> dict[str, Any]:
    return {"topic": "o", "key": name, "schema": "s", "payload": {}, "headers": {}, "created_at": created,
            "sent_at": sent}


def transition_row(name: str, at: datetime) -> dict[str, Any]:
    return {"op_key": name, "from_state": None, "to_state": "pending", "attempt": 0, "actor": "t", "at": at}


def where_rows_are(engine) -> dict[tuple[str, str], str]:
    """The partition of each outbox row and transition, by table and key (op key)."""
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT 'outbox', key, c.relname FROM lapse.lapse_outbox o JOIN pg_class c ON c.oid = o.tableoid "
            "UNION ALL SELECT 'transitions', op_key, c.relname FROM lapse.lapse_transitions t "
            "JOIN pg_class c ON c.oid = t.tableoid").all()
    return {(table, k): where for table, k, where in rows}


def partition_names(engine, scheme: parts.Scheme) -> list[str]:
    with engine.connect() as conn:
        return [p.name for p in parts.partitions(conn, scheme)]


def test_partitions_are_created_ahead_dropped_whole_pinned_by_unsent_rows_and_default_drained(pg_url):
    """A pass at today + 40 days (a fake clock): the partitions ahead of it are created, the rows
    waiting in DEFAULT for their range move in; every partition past its horizon is dropped, except
    an outbox day holding an unsent row or a row sent within the horizon; DEFAULT's old rows go in
    batches, its unsent one stays. The dry run before says exactly that; a second pass does nothing
    more; once the unsent row is sent, its day goes too."""
    engine = engine_for(pg_url)
    today = parts.OUTBOX.floor(datetime.now(NOW.tzinfo))
    at = today + timedelta(days=40)
    hour, day = timedelta(hours=1), timedelta(days=1)
    with engine.begin() as conn:
        conn.execute(insert(outbox), [
            outbox_row("sent-early", today + hour, today + 2 * hour),  # today's partition: goes
            outbox_row("unsent", today + day + hour, None),  # tomorrow's: pinned
            outbox_row("sent-late", today + 2 * day + hour, at - 12 * hour),  # the day after: pinned
            outbox_row("default-sent", today - 60 * day, today - 60 * day),  # DEFAULT, old: deleted
            outbox_row("default-unsent", today - 60 * day, None),  # DEFAULT, unsent: stays
            outbox_row("ahead", at + 5 * day, None),  # DEFAULT until its day is created
        ])
        conn.execute(insert(ledger_transitions), [
            transition_row("this-week", today + hour), transition_row("default-old", today - 60 * day),
            transition_row("ahead", at + 2 * day)])
    before = where_rows_are(engine)
    assert before["transitions", "ahead"] == "lapse_transitions_default"
    assert before["outbox", "ahead"] == "lapse_outbox_default"
    assert before["outbox", "sent-early"] == f"lapse_outbox_p{today:%Y%m%d}"
    history_cutoff = HORIZONS.history.cutoff(at)
    assert history_cutoff is not None
    with engine.connect() as conn:
        old_weeks = [p.name for p in rotation.expired(parts.partitions(conn, parts.TRANSITIONS), history_cutoff)]
    old_days = [f"lapse_outbox_p{today + k * day:%Y%m%d}" for k in range(8)]  # all the migration made
    pinned = {old_days[1]: "holds unsent rows", old_days[2]: "within the horizon"}
    new_days = [f"lapse_outbox_p{at + k * day:%Y%m%d}" for k in range(8)]
    new_weeks = [f"lapse_transitions_p{parts.TRANSITIONS.floor(at) + timedelta(weeks=k):%Y%m%d}" for k in range(3)]

    dry = prune_dry_run(engine, HORIZONS, at)
    report = prune_once(engine, HORIZONS, at, batch_size=100)

    for shown in (dry, report):
        work = shown.partitions
        assert work["outbox"].create == new_days and work["transitions"].create == new_weeks
        assert [d["name"] for d in work["outbox"].drop] == [d for d in old_days if d not in pinned]
        assert [d["name"] for d in work["transitions"].drop] == old_weeks and old_weeks
        assert {p["name"]: p["reason"] for p in work["outbox"].pinned}.keys() == pinned.keys()
        assert all(want in {p["name"]: p["reason"] for p in work["outbox"].pinned}[name]
                   for name, want in pinned.items())
        assert shown.removed == {"ledger_settled": 0, "ledger_dead_letters": 0, "transitions": 1, "outbox": 1,
                                 "shadow_effects": 0}
    assert report.partitions["outbox"].moved_from_default == 1
    assert report.partitions["transitions"].moved_from_default == 1
    assert where_rows_are(engine) == {
        ("outbox", "unsent"): old_days[1], ("outbox", "sent-late"): old_days[2],
        ("outbox", "default-unsent"): "lapse_outbox_default",
        ("outbox", "ahead"): f"lapse_outbox_p{at + 5 * day:%Y%m%d}",
        ("transitions", "ahead"): f"lapse_transitions_p{parts.TRANSITIONS.floor(at + 2 * day):%Y%m%d}"}
    assert partition_names(engine, parts.OUTBOX) == [*pinned, *new_days, "lapse_outbox_default"]

    again = prune_once(engine, HORIZONS, at, batch_size=100)
    assert (again.partitions["outbox"].create, again.partitions["outbox"].drop) == ([], [])
    assert (again.partitions["transitions"].create, again.partitions["transitions"].drop) == ([], [])
    assert sum(again.removed.values()) == 0 and len(again.partitions["outbox"].pinned) == 2

    from lapse.producers.relay_queries import mark_sent  # the relay marks the unsent row sent, long ago

    with engine.begin() as conn:
        unsent_id = conn.execute(select(outbox.c.id).where(outbox.c.key == "unsent")).scalar_one()
        mark_sent(conn, [unsent_id], today + day + 2 * hour, (today + day + hour, today + day + hour))
    last = prune_once(engine, HORIZONS, at, batch_size=100)
    assert [d["name"] for d in last.partitions["outbox"].drop] == [old_days[1]]
    assert [p["name"] for p in last.partitions["outbox"].pinned] == [old_days[2]]


def test_a_locked_table_leaves_its_partitions_for_the_next_pass(pg_url, monkeypatch):
    """A long transaction reading the outbox: the pass does not queue writers behind its DDL; it
    gives up on each partition after lock_timeout, says so, and the next pass does the work."""
    monkeypatch.setattr(rotation, "LOCK_TIMEOUT_MS", 50)
    engine = engine_for(pg_url)
    at = parts.OUTBOX.floor(datetime.now(NOW.tzinfo)) + timedelta(days=9)  # today's and tomorrow's expired
    reader = engine.connect()
    try:
        reader.execute(select(outbox.c.id).limit(1)).all()  # ACCESS SHARE on every outbox partition, held
        blocked = prune_once(engine, HORIZONS, at, batch_size=100)
    finally:
        reader.close()
    skipped = blocked.partitions["outbox"].skipped
    assert {s["action"] for s in skipped} == {"create", "drop"}
    assert blocked.partitions["outbox"].create == [] and blocked.partitions["outbox"].drop == []
    assert blocked.partitions["transitions"].create  # the transitions were not locked

    done = prune_once(engine, HORIZONS, at, batch_size=100)
    assert sorted(done.partitions["outbox"].create + [d["name"] for d in done.partitions["outbox"].drop]) == sorted(
        s["name"] for s in skipped)
    assert done.partitions["outbox"].skipped == []


def test_the_command_lists_partitions_on_postgresql(pg_url):
    env = {"LAPSE_DATABASE__URL": pg_url}
    dry = CliRunner().invoke(main, ["prune", "--dry-run", "--json"], env=env)
    assert dry.exit_code == 0, dry.output
    shown = json.loads(dry.stdout)
    assert set(shown["partitions"]) == {"transitions", "outbox"}
    assert shown["partitions"]["outbox"]["create"] == []  # the migration made a week ahead
    assert "as long as dead letters" in shown["tables"]["transitions"]["reason"]

    text = CliRunner().invoke(main, ["prune", "--dry-run"], env=env)
    assert text.exit_code == 0, text.output
    assert "outbox partitions" in text.stdout and "would drop none" in text.stdout, text.stdout


def test_the_history_horizon_defaults_to_the_dead_letters_and_is_never_shorter_than_the_ledgers():
    assert HORIZONS.history.seconds == DEAD_S and "as long as dead letters" in HORIZONS.history.reason
    longer = horizons(expiry_topic="expiry", expiry_retention_ms=str(14 * 86_400_000), dlq_topic="dlq",
                      dlq_retention_ms=str(30 * 86_400_000), grace_s=GRACE_S, outbox_horizon_s=DAY,
                      history_horizon_s=SETTLED_S)
    assert longer.history.seconds == SETTLED_S
    try:
        horizons(expiry_topic="expiry", expiry_retention_ms=str(14 * 86_400_000), dlq_topic="dlq",
                 dlq_retention_ms=str(30 * 86_400_000), grace_s=GRACE_S, outbox_horizon_s=DAY,
                 history_horizon_s=DAY)
    except HorizonRefused as exc:
        assert "history_horizon_s 1d is shorter than 14d 5m" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("a history horizon shorter than the ledger's was kept")
