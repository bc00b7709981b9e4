"""A PostgreSQL that fails over, for real: what the server says (a read-only transaction, a
terminated session, a deadlock, a statement timeout, DDL on a read-only database) is an outage by
its SQLSTATE; cleanup workers meeting a read-only database for 15 s dead-letter nothing, rewind
and apply every event once when it is writable again; the console goes on showing its pages and
answers an operator action with a one-line 503, and the same action as a command exits 4 with one
line. On a server of the test's own, a crashed backend (crash_shutdown, 57P02) and an immediate
stop followed by a start that refuses connections (cannot_connect_now, 57P03) are ridden out by a
`lapse process` worker. (Every role as processes: test_outages.py.)"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.exc import DBAPIError

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_tables import reservations
from lapse.kernel import ledger
from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.kernel.outages import database_outage, is_transient, sqlstate
from lapse.kernel.settings import load_settings
from lapse.processors.commit import _apply_with_retry, isolate_failures
from lapse.processors.scope import BatchScope
from lapse.retention import horizons_from_settings, prune_once
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.console import csrf_of, pages_answer, refused_replay, replay_when_writable, running_console
from tests.fixtures.db import migrate_with_demo_tables
from tests.fixtures.faults import read_only_failover, terminate_sessions
from tests.fixtures.kafka import read_topic
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.pipeline import (
    Pipeline,
    all_committed,
    applied,
    connection_env,
    expiry_event,
    invalid_subject_event,
    make_pipeline_settings,
    produce,
    seed,
)
from tests.fixtures.polling import eventually
from tests.fixtures.private_postgres import PrivateCluster
from tests.fixtures.processes import ASSIGNED, RoleProcesses, run_lapse
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


def test_a_worker_process_rides_out_a_crashed_server_and_a_start_that_refuses_connections(
        private_postgres, kafka_bootstrap, unique, tmp_path):
    """A private server, so it can be crashed. First a backend is SIGKILLed while the worker's batch
    waits on its row lock: the server ends every session with crash_shutdown (57P02) and runs
    crash recovery. Then `pg_ctl stop -m immediate` and a start as a standby with hot standby off,
    which refuses every connection with cannot_connect_now (57P03) for 10 s, until promoted. The
    worker does not exit, dead-letters nothing, and applies each event once."""
    admin = create_engine(private_postgres.url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("CREATE DATABASE lapse"))
    admin.dispose()
    url = private_postgres.url("lapse")
    migrate_with_demo_tables(url)
    settings = make_pipeline_settings(kafka_bootstrap, url, unique)
    p = Pipeline(settings, make_engine(url), Codec.from_settings(settings))
    ids = seed(p, 300)
    procs = RoleProcesses(settings, tmp_path, runtime__log_level="DEBUG")  # each retry's error is a debug line
    try:
        worker = procs.start("process")
        eventually(lambda: worker.said(ASSIGNED), timeout_s=90, what="the worker assigned")
        produce(p, [expiry_event(i) for i in ids[:100]])
        eventually(lambda: applied(p) == 100, timeout_s=60, what="the first 100 applied")

        # A crash: the next batch waits on a row lock the test holds, and the holder's backend is killed.
        crashed = _crash_under_a_waiting_batch(private_postgres, p, ids[100:200])
        # The server's crash_shutdown (57P02) comes as a warning before it closes each session.
        assert ("57P02", "terminating connection because of crash of another server process") in crashed
        eventually(lambda: _connect_error(url) is None and applied(p) == 200, timeout_s=90,
                   what="the second 100 applied after the recovery")

        # An immediate stop, then a start that refuses every connection until it is promoted.
        private_postgres.crash()
        private_postgres.start(standby=True)
        refused = eventually(lambda: _connect_error(url, "not accepting connections"), timeout_s=30,
                             what="the standby refusing connections (57P03)")
        # psycopg raises a refused connection without the server's SQLSTATE: an outage as a lost connection.
        assert (sqlstate(refused), database_outage(refused)) == (None, "connection lost")
        produce(p, [expiry_event(i) for i in ids[200:]])
        eventually(lambda: worker.said("not accepting connections"), timeout_s=30, what="the worker meeting 57P03")
        time.sleep(10)
        assert worker.proc.poll() is None, worker.tail()
        private_postgres.promote()
        eventually(lambda: applied(p) == len(ids) and all_committed(p), timeout_s=90,
                   what="every event applied and committed once the server accepts connections")
        worker.terminate()
        assert worker.wait_exit(30) == 0, worker.tail()
        assert worker.said("server closed the connection unexpectedly"), worker.tail()  # the crash's sessions
        _assert_applied_once(p, ids)
        assert read_topic(settings.kafka.bootstrap_servers, settings.topology.dlq) == []
    finally:
        procs.close()
        p.engine.dispose()


def _crash_under_a_waiting_batch(cluster: PrivateCluster, p: Pipeline, ids: list[int]) -> list[tuple[str, str]]:
    """Lock the reservations `ids` in a session of the test's, produce their events, wait until the
    worker's batch waits on the lock, then SIGKILL the lock holder's backend. Returns the notices a
    bystander session received (the server's crash_shutdown warning)."""
    raw = f"host=127.0.0.1 port={cluster.port} user=postgres dbname=lapse"
    holder, bystander = psycopg.connect(raw), psycopg.connect(raw, autocommit=True)
    notices: list[tuple[str, str]] = []
    bystander.add_notice_handler(lambda d: notices.append((d.sqlstate or "", d.message_primary or "")))
    try:
        holder.execute("SELECT id FROM reservations WHERE id = ANY(%s) FOR UPDATE", [ids])
        produce(p, [expiry_event(i) for i in ids])
        eventually(lambda: bystander.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = 'lapse'"
        ).fetchone()[0] > 0, timeout_s=60, what="the worker's batch waiting on the lock")
        cluster.kill_backend(holder.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):  # every session ended by the server
            for _ in range(50):
                bystander.execute("SELECT 1")
                time.sleep(0.1)
    finally:
        holder.close()
        bystander.close()
    return notices


def _connect_error(url: str, saying: str = "") -> DBAPIError | None:
    """The error a new connection to `url` meets now, if its message says `saying` (None when it
    connects, or fails otherwise)."""
    engine = make_engine(url, pre_ping=False)
    try:
        with engine.connect():
            return None
    except DBAPIError as exc:
        return exc if saying in str(exc.orig) else None
    finally:
        engine.dispose()


def test_the_console_serves_its_pages_from_a_read_only_database_and_refuses_actions_with_a_503(
        pipeline, tmp_path):
    invalid = invalid_subject_event()  # a dead letter at once
    produce(pipeline, [invalid])
    process_until_done(pipeline.settings, terminal=1)
    bad = invalid.op_key
    settings = pipeline.settings.with_(console={"operator_tokens": {OPERATOR[0]: OPERATOR[1]}})
    with read_only_failover(settings.database.url_plain()) as failover, running_console(settings) as console, \
            httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {OPERATOR[1]}"}) as client:
        failover.begin()
        pages_answer(client, bad)
        token = csrf_of(client.get("/dead-letters").text)
        message = refused_replay(client, token, bad)
        assert "read-only" in message and "try again" in message, message
        # The same action as a one-shot command: exit 4 and one line, as for a database away.
        (cli,) = run_lapse(["dlq", "replay", "--op-key", bad, "--limit", "1", "--reason", "failover",
                            "--actor", "alice", "--yes"], env=connection_env(settings), cwd=tmp_path)
        assert (cli.code, len(cli.stderr)) == (ExitCode.UNREACHABLE, 1), cli
        assert "unavailable (read-only)" in cli.stderr[0] and "read-only transaction" in cli.stderr[0], cli
        failover.end()
        assert replay_when_writable(client, token, bad).status_code == 303
    with pipeline.engine.connect() as conn:
        assert conn.execute(select(cleanup_ledger.c.state).where(cleanup_ledger.c.op_key == bad)).scalar() == "pending"
