"""A PostgreSQL that fails over, for real: what the server says (a read-only transaction, a
terminated session, a deadlock, a statement timeout, DDL on a read-only database) is an outage by
its SQLSTATE; cleanup workers meeting a read-only database for 15 s dead-letter nothing, rewind
and apply every event once when it is writable again; the console goes on showing its pages and
answers an operator action with a one-line 503, and the same action as a command exits 4 with one
line. (Every role as processes: test_outages.py.)"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import DBAPIError

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_tables import reservations
from lapse.kernel import ledger
from lapse.kernel.database import make_engine
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.kernel.outages import database_outage, is_transient, sqlstate
from lapse.kernel.settings import load_settings
from lapse.processors.commit import _apply_with_retry, isolate_failures
from lapse.processors.scope import BatchScope
from lapse.retention import horizons_from_settings, prune_once
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.console import running_console
from tests.fixtures.faults import read_only_failover, terminate_sessions
from tests.fixtures.kafka import read_topic
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.pipeline import all_committed, applied, connection_env, expiry_event, produce, seed
from tests.fixtures.polling import eventually
from tests.fixtures.processes import run_lapse
from tests.fixtures.topology import repo_topology
from tests.fixtures.workers import process_until_done, running_workers

FAILOVER_S = 15.0
OPERATOR = ("alice", "op-token-7d2a5e91c04b")

pytestmark = pytest.mark.slow


def caught(call) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("no error raised")


def test_what_postgresql_says_while_it_fails_over_is_an_outage_by_its_sqlstate(pg_url):
    engine = make_engine(pg_url)
    settings = load_settings(database={"url": pg_url})
    try:
        with read_only_failover(pg_url) as failover:
            failover.begin()
            with engine.connect() as conn:
                write = caught(lambda: conn.execute(update(cleanup_ledger).values(attempt=0)))
            # Partition rotation, a month ahead: CREATE TABLE, LOCK TABLE, ATTACH on a read-only database.
            ddl = caught(lambda: prune_once(engine, horizons_from_settings(settings),
                                            datetime.now(UTC) + timedelta(days=40), 100))
            with engine.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM lapse_ledger")).scalar() == 0  # reads serve
        for exc in (write, ddl):
            assert sqlstate(exc) == "25006" and database_outage(exc) == "read-only", exc
            assert "read-only transaction" in str(exc)

        # A session terminated under its holder (a failover, an operator): 57P01, or no SQLSTATE at
        # all when the server's last message was lost with the connection.
        admin = make_engine(pg_url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            terminate_sessions(admin.execution_options(isolation_level="AUTOCOMMIT"),
                               engine.url.database or "")
            terminated = caught(lambda: conn.execute(text("SELECT 1")))
        admin.dispose()
        assert sqlstate(terminated) in ("57P01", None) and is_transient(terminated), terminated

        # A statement timeout: 57014.
        with engine.connect() as conn:
            conn.execute(text("SET statement_timeout = '50ms'"))
            timed_out = caught(lambda: conn.execute(text("SELECT pg_sleep(2)")))
        assert sqlstate(timed_out) == "57014" and is_transient(timed_out)

        # A deadlock between two transactions: 40P01 for the one PostgreSQL picks.
        assert sqlstate(_deadlock(engine)) == "40P01"

        # A server that is not there: a connection refused, without a SQLSTATE.
        refused = caught(lambda: make_engine("postgresql+psycopg://lapse@127.0.0.1:1/x").connect())
        assert isinstance(refused, DBAPIError) and isinstance(refused.orig, psycopg.OperationalError)
        assert database_outage(refused) == "connection lost"
    finally:
        engine.dispose()


def _deadlock(engine) -> BaseException:
    """Two transactions locking two rows in opposite orders; the error of the one that lost."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE deadlocked (id int PRIMARY KEY)"))
        conn.execute(text("INSERT INTO deadlocked VALUES (1), (2)"))
    both_hold = threading.Barrier(2)
    errors: list[BaseException] = []

    def lock(first: int, second: int) -> None:
        try:
            with engine.begin() as conn:
                conn.execute(text("SELECT * FROM deadlocked WHERE id = :id FOR UPDATE"), {"id": first})
                both_hold.wait(10)
                conn.execute(text("SELECT * FROM deadlocked WHERE id = :id FOR UPDATE"), {"id": second})
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=lock, args=ab) for ab in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(errors) == 1, errors
    return errors[0]


def test_a_read_only_error_in_one_events_transaction_is_no_events_fault(pg_url):
    """The batch transaction fails on a database turned read-only, and while the batch is redone
    event by event the database is writable again: the event that met it must not be dead-lettered
    (its dead letter would have succeeded). The batch raises the outage instead, to be rewound."""
    engine = make_engine(pg_url)
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    with engine.begin() as conn:
        ids = add_reservations(conn, 5, tenant="t1", expires_at=now - timedelta(minutes=10))
    release = demo_kinds(engine)["release-reservation"]

    def read_only_for_the_third(conn, subjects, at):
        """The declared release, on a transaction turned read-only when it holds the third subject."""
        if ids[2] in subjects:
            conn.execute(text("SET TRANSACTION READ ONLY"))
        return release.apply_in_db(conn, subjects, at)

    kinds = {"release-reservation": replace(release, apply_in_db=read_only_for_the_third)}
    events = [ledger.expiry_event("release-reservation", i, "t1", now - timedelta(minutes=5), source="sweep",
                                  correlation_id=f"c-{i}") for i in ids]
    for attempt in (lambda scope: _apply_with_retry(scope, events, []), lambda scope: isolate_failures(scope, events)):
        with engine.connect() as conn:
            scope = BatchScope(conn, kinds=kinds, topics=repo_topology(), worker="w1", now=now,
                               lease=timedelta(seconds=30))
            raised = caught(lambda: attempt(scope))  # noqa: B023 (called at once)
        assert sqlstate(raised) == "25006" and is_transient(raised), raised
    with engine.connect() as conn:
        states = Counter(conn.execute(select(cleanup_ledger.c.state)).scalars())
        held = conn.execute(select(func.count()).where(reservations.c.status == "held")).scalar()
    assert "dead_letter" not in states, states
    assert held >= 1  # the third is not released
    engine.dispose()


def test_workers_meeting_a_read_only_database_dead_letter_nothing_and_apply_each_event_once(pipeline):
    ids = seed(pipeline, 300)
    with read_only_failover(pipeline.settings.database.url_plain()) as failover:
        with running_workers(pipeline.settings, 2) as running:
            eventually(lambda: all(w.owned for w in running.workers), timeout_s=60, what="both workers assigned")
            failover.begin()
            produce(pipeline, [expiry_event(i) for i in ids])
            eventually(lambda: all(w.stats.batch_failures for w in running.workers if w.stats.consumed),
                       timeout_s=60, what="the workers that consumed met the read-only database")
            time.sleep(FAILOVER_S)
            running.check()
            assert applied(pipeline) == 0
            failover.end()
            eventually(lambda: applied(pipeline) == len(ids) and all_committed(pipeline), timeout_s=120,
                       what="every event applied and committed once the database is writable")
            outages = [w.outage.outages for w in running.workers]
        stats = running.stats()
    assert sum(s.batch_failures for s in stats) > 0
    assert sum(s.dead_lettered + s.poison for s in stats) == 0
    # One warning per outage: the switch to read-only and, maybe, the sessions ended at its end.
    assert all(n <= 2 for n in outages), outages
    _assert_applied_once(pipeline, ids)
    assert read_topic(pipeline.settings.kafka.bootstrap_servers, pipeline.settings.topology.dlq) == []


def _assert_applied_once(pipeline, ids: list[int]) -> None:
    """Every op key applied by one `applied` transition, every business row released, no dead letter."""
    with pipeline.engine.connect() as conn:
        states = Counter(conn.execute(select(cleanup_ledger.c.state)).scalars())
        per_key = Counter(conn.execute(select(ledger_transitions.c.op_key).where(
            ledger_transitions.c.to_state == "applied")).scalars())
        released = conn.execute(select(func.count()).where(
            reservations.c.id.in_(ids), reservations.c.status == "released")).scalar()
    assert states == {"applied": len(ids)}
    assert len(per_key) == len(ids) and set(per_key.values()) == {1}
    assert released == len(ids)


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def test_the_console_serves_its_pages_from_a_read_only_database_and_refuses_actions_with_a_503(
        pipeline, tmp_path):
    (wrong_tenant,) = seed(pipeline, 1, tenant="t2")  # expiry_event's tenant is t1: a dead letter
    produce(pipeline, [expiry_event(wrong_tenant)])
    process_until_done(pipeline.settings, terminal=1)
    bad = expiry_event(wrong_tenant).op_key
    settings = pipeline.settings.with_(console={"operator_tokens": {OPERATOR[0]: OPERATOR[1]}})
    with read_only_failover(settings.database.url_plain()) as failover, running_console(settings) as console, \
            httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {OPERATOR[1]}"}) as client:
        failover.begin()
        for page in ("/", "/dead-letters", f"/operations/{bad}", "/activity"):
            shown = client.get(page)
            assert shown.status_code == 200, (page, shown.text[-500:])
        token = csrf_of(client.get("/dead-letters").text)
        refused = client.post("/dead-letters/replay/confirm",
                              data={"csrf_token": token, "op_key": bad, "reason": "during the failover"})
        assert refused.status_code == 503, refused.text[-500:]
        message = re.search(r'id="message">([^<]*)<', refused.text)
        assert message and "read-only" in message.group(1) and "try again" in message.group(1), refused.text
        # The same action as a one-shot command: exit 4 and one line, as for a database away.
        (cli,) = run_lapse(["dlq", "replay", "--op-key", bad, "--limit", "1", "--reason", "failover",
                            "--actor", "alice", "--yes"], env=connection_env(settings), cwd=tmp_path)
        assert (cli.code, len(cli.stderr)) == (ExitCode.UNREACHABLE, 1), cli
        assert "unavailable (read-only)" in cli.stderr[0] and "read-only transaction" in cli.stderr[0], cli
        failover.end()
        assert _replay_when_writable(client, token, bad).status_code == 303
    with pipeline.engine.connect() as conn:
        assert conn.execute(select(cleanup_ledger.c.state).where(cleanup_ledger.c.op_key == bad)).scalar() == "pending"


def _replay_when_writable(client: httpx.Client, token: str, op_key: str) -> httpx.Response:
    """The confirmed replay, posted again until the console accepts it (its pool's sessions were
    terminated with the failover's end, so the first try may meet a closed connection)."""
    answers: list[httpx.Response] = []

    def accepted() -> bool:
        answers.append(client.post("/dead-letters/replay/confirm", follow_redirects=False, data={
            "csrf_token": token, "op_key": op_key, "reason": "after the failover"}))
        return answers[-1].status_code == 303

    eventually(accepted, timeout_s=30, what="the replay accepted once the database is writable")
    return answers[-1]
