"""Outages with every role running (`lapse run`, a subprocess): the schema registry down for 10 s,
every database connection terminated in a loop for 10 s, the database read-only for 15 s as in a
managed failover (also under single-role processes, and with the console under `lapse run
--console`), a database that accepts connections and never answers. No role exits (the supervisor
restarts none), nothing is lost, nothing is applied twice, nothing is dead-lettered, and each role
logs one warning per outage, not one per retry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import func, select

from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker, make_producer
from lapse.kernel.ledger import expiry_record
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.settings import env_var
from lapse.producers.emit import emit_events
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.console import csrf_of, pages_answer, refused_replay, replay_when_writable
from tests.fixtures.faults import ConnectionKiller, read_only_failover, schema_registry, silent_listener
from tests.fixtures.kafka import read_topic
from tests.fixtures.pipeline import (
    Pipeline,
    all_committed,
    applied,
    expiry_event,
    invalid_subject_event,
    produce,
    seed,
)
from tests.fixtures.polling import eventually
from tests.fixtures.private_postgres import free_port
from tests.fixtures.processes import ASSIGNED, RoleProcesses
from tests.fixtures.running import RunningPipeline, lapse_run
from tests.fixtures.workers import process_until_done

OUTAGE_S = 10.0
FAILOVER_S = 15.0
WORKERS = 2
ROLES = WORKERS + 5  # sweep, relay, delay, reconcile, monitor
# A command facing a hung database ends within its connect timeout plus this after its first
# connection attempt (a busy machine; a second attempt at the default 10 s timeout would not fit).
MARGIN_S = 6.0
OPERATOR = ("alice", "op-token-7d2a5e91c04b")

pytestmark = pytest.mark.slow


def outbox_drained(p: Pipeline, at_least: int) -> bool:
    with p.engine.connect() as conn:
        unsent = conn.execute(select(func.count()).where(outbox.c.sent_at.is_(None))).scalar()
        total = conn.execute(select(func.count()).select_from(outbox)).scalar()
    return unsent == 0 and total >= at_least


def caught_up(p: Pipeline, running: RunningPipeline, n: int) -> bool:
    """All `n` applied, every outcome relayed, every expiry offset committed."""
    running.assert_alive()
    return applied(p) == n and outbox_drained(p, n) and all_committed(p)


def assert_applied_once_each(p: Pipeline, n: int) -> None:
    """`n` op keys, every ledger row applied, each by exactly one `applied` transition, and every
    expiry offset committed. (With all roles running, the reconciler may record a row `pending`
    before the sweep does: a transition of its own, so the transitions are not counted whole as
    `assert_each_applied_once` does.)"""
    with p.engine.connect() as conn:
        states = Counter(conn.execute(select(cleanup_ledger.c.state)).scalars())
        applied_by_key = Counter(conn.execute(select(ledger_transitions.c.op_key).where(
            ledger_transitions.c.to_state == "applied")).scalars())
    assert states == {"applied": n}
    assert len(applied_by_key) == n and set(applied_by_key.values()) == {1}
    assert all_committed(p)


def warnings_by_role(running: RunningPipeline) -> Counter[str]:
    """The outage warnings logged, by role ("processor", "sweep", …)."""
    return Counter(str(line["msg"]).split(":")[0] for line in running.lines()
                   if "dependency unavailable" in str(line.get("msg")))


def met_outage(running: RunningPipeline) -> bool:
    roles = set(warnings_by_role(running))
    return "processor" in roles and bool(roles & {"sweep", "reconcile"})


def test_every_role_rides_out_a_schema_registry_outage(pipeline, tmp_path):
    with schema_registry() as registry:
        settings = pipeline.settings.with_(schemas={"registry_url": registry.url})
        codec = Codec.from_settings(settings)
        codec.encode("expiry_event", expiry_record(expiry_event(0), datetime.now(UTC)))  # registers its id
        with lapse_run(settings, tmp_path, **{env_var("schemas.registry_url"): registry.url}) as running:
            eventually(lambda: running.logged("partitions assigned") >= WORKERS, timeout_s=90,
                       what="both processors assigned")
            registry.stop()
            stopped = time.monotonic()
            # Events in registry format while it is down: from the test (an outside producer) and
            # from the sweep or the reconciler (whichever records the rows first), which cannot
            # register their schema until the registry is back.
            rows = seed(pipeline, 100, tenant="t1")
            emit_events(make_producer(settings), codec, DeliveryTracker(), settings.topology.expiry,
                        [expiry_event(i) for i in rows], datetime.now(UTC))
            eventually(lambda: met_outage(running), timeout_s=60,
                       what="the processors, and the sweep or the reconciler, meet the outage")
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped)))  # the fault lasts 10 s
            running.assert_alive()
            assert applied(pipeline) == 0
            registry.start()  # the same port
            eventually(lambda: caught_up(pipeline, running, 100), timeout_s=120,
                       what="100 applied, outcomes relayed, offsets committed after the outage")
            running.assert_alive()
            warned = warnings_by_role(running)
    # One warning per role and outage, not one per try (a role whose next pass has nothing to emit
    # ends its outage early, and may meet it again).
    assert warned["processor"] <= WORKERS and warned["sweep"] + warned["reconcile"] <= 4, warned
    assert_applied_once_each(pipeline, 100)


def test_every_role_rides_out_database_connections_terminated_in_a_loop(pipeline, tmp_path):
    first = seed(pipeline, 50, tenant="t1")
    with lapse_run(pipeline.settings, tmp_path) as running:
        eventually(lambda: caught_up(pipeline, running, 50), timeout_s=120, what="the first 50 applied")
        # Due while the connections are being killed: swept, applied and relayed through the fault.
        second = seed(pipeline, 150, tenant="t1", expires_at=datetime.now(UTC) + timedelta(seconds=2))
        killer = ConnectionKiller(pipeline.settings.database.url_plain(), every_s=0.2)
        try:
            # Also events straight onto the topic, as an outside producer would (no database needed).
            emit_events(make_producer(pipeline.settings), pipeline.codec, DeliveryTracker(),
                        pipeline.settings.topology.expiry, [expiry_event(i) for i in first[:25]],
                        datetime.now(UTC))
            time.sleep(OUTAGE_S)  # the fault lasts 10 s
        finally:
            killer.stop()
        assert killer.terminated > 0
        running.assert_alive()
        eventually(lambda: caught_up(pipeline, running, 200), timeout_s=120,
                   what="all 200 applied, outcomes relayed, offsets committed after the fault")
        running.assert_alive()
    assert len(second) == 150
    assert_applied_once_each(pipeline, 200)


def test_every_role_rides_out_a_read_only_failover(pipeline, tmp_path):
    """`ALTER DATABASE … SET default_transaction_read_only` and every session terminated, for 15 s,
    then writable again and every session terminated once more: the sessions of every role land
    on "the replica" and back, as in a managed failover."""
    first = seed(pipeline, 50, tenant="t1")
    with read_only_failover(pipeline.settings.database.url_plain()) as failover, \
            lapse_run(pipeline.settings, tmp_path) as running:
        eventually(lambda: caught_up(pipeline, running, 50), timeout_s=120, what="the first 50 applied")
        second = seed(pipeline, 150, tenant="t1", expires_at=datetime.now(UTC) + timedelta(seconds=2))
        failover.begin()
        began = time.monotonic()
        # Duplicates straight onto the topic (an outside producer): each needs a ledger write.
        emit_events(make_producer(pipeline.settings), pipeline.codec, DeliveryTracker(),
                    pipeline.settings.topology.expiry, [expiry_event(i) for i in first[:25]], datetime.now(UTC))
        eventually(lambda: met_outage(running), timeout_s=60,
                   what="the processors, and the sweep or the reconciler, meet the read-only database")
        time.sleep(max(0.0, FAILOVER_S - (time.monotonic() - began)))
        running.assert_alive()
        assert applied(pipeline) == 50  # nothing written while read-only
        failover.end()
        eventually(lambda: caught_up(pipeline, running, 200), timeout_s=90,
                   what="all 200 applied, outcomes relayed, offsets committed once writable again")
        running.assert_alive()
        warned = warnings_by_role(running)
        read_only = sum("read-only transaction" in str(line.get("error")) for line in running.lines())
    assert len(second) == 150 and read_only > 0
    # One warning per role and outage: the switch to read-only, and maybe the sessions ended by the
    # switch back (a pass role whose next pass only reads ends its outage early, and may meet it again).
    assert warned["processor"] <= 2 * WORKERS and warned["relay"] <= 2, warned
    assert all(n <= 4 for role, n in warned.items() if role != "processor"), warned
    assert_applied_once_each(pipeline, 200)
    assert read_topic(pipeline.settings.kafka.bootstrap_servers, pipeline.settings.topology.dlq) == []


def test_the_console_under_lapse_run_keeps_answering_through_a_read_only_failover(pipeline, tmp_path):
    """`lapse run --console` through the same failover: the console serves its pages while the
    database is read-only, answers an operator action with a 503 and one line, takes the action
    once the database is writable again, and neither it nor `lapse run` exits."""
    invalid = invalid_subject_event()  # a dead letter at once
    produce(pipeline, [invalid])
    process_until_done(pipeline.settings, terminal=1)
    bad = invalid.op_key
    port = free_port()
    console = {env_var("console.port"): str(port),
               env_var("console.operator_tokens"): json.dumps({OPERATOR[0]: OPERATOR[1]})}
    with read_only_failover(pipeline.settings.database.url_plain()) as failover, \
            lapse_run(pipeline.settings, tmp_path, "--console", **console) as running, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {OPERATOR[1]}",
                                                                       "Origin": f"http://127.0.0.1:{port}"},
                         timeout=30) as client:
        eventually(lambda: _answers(client), timeout_s=90, what="the console under lapse run")
        token = csrf_of(client.get("/dead-letters").text)
        failover.begin()
        pages_answer(client, bad)
        message = refused_replay(client, token, bad)
        assert "read-only" in message and "try again" in message and "\n" not in message, message
        running.assert_alive()
        failover.end()
        assert replay_when_writable(client, token, bad).status_code == 303
        pages_answer(client, bad)
        running.assert_alive()
        # One warning when the outage begins, not one per refused request.
        assert running.logged("console: the database is unavailable") == 1
        assert not running.logged("Traceback"), "the 503 logged a traceback"
    with pipeline.engine.connect() as conn:
        assert conn.execute(select(cleanup_ledger.c.replay_id).where(cleanup_ledger.c.op_key == bad)).scalar()


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/").status_code == 200
    except httpx.TransportError:
        return False


def test_single_role_processes_ride_out_a_read_only_failover(pipeline, tmp_path):
    """The same failover under one process per role, as compose or Kubernetes runs them: no
    process exits (there is no supervisor to restart it), and each stops cleanly afterwards."""
    procs = RoleProcesses(pipeline.settings, tmp_path, producer__sweep_interval_s=1, reconciler__interval_s=2,
                          retention__interval_s=2, report__interval_s=2, report__dir=tmp_path / "reports")
    try:
        workers = [procs.start("process") for _ in range(WORKERS)]
        relay = procs.start("relay")
        for command, *args in (["sweep"], ["reconcile"], ["prune", "--watch"], ["report", "--serve"], ["delay"]):
            procs.start(command, *args)
        eventually(lambda: any(w.said(ASSIGNED) for w in workers), timeout_s=90, what="a worker assigned")
        # Due once the database is read-only: the sweep meets it; and events straight onto the
        # topic (an outside producer), so the workers meet it too.
        ids = seed(pipeline, 200, tenant="t1", expires_at=datetime.now(UTC) + timedelta(seconds=2))
        with read_only_failover(pipeline.settings.database.url_plain()) as failover:
            failover.begin()
            began = time.monotonic()
            produce(pipeline, [expiry_event(i) for i in ids[:100]])
            late = procs.start("process")  # a worker (re)started during the failover, as a pod would be
            eventually(lambda: all(p.said("dependency unavailable") for p in [*workers, procs.started[3]]),
                       timeout_s=60, what="the workers and the sweep meet the failover")
            time.sleep(max(0.0, FAILOVER_S - (time.monotonic() - began)))
            assert not _exited(procs)
            assert applied(pipeline) == 0
            failover.end()
        assert any(p.said("read-only transaction") for p in procs.started)
        eventually(lambda: not _exited(procs) and applied(pipeline) == len(ids)
                   and outbox_drained(pipeline, len(ids)) and all_committed(pipeline), timeout_s=90,
                   what="every event applied, relayed and committed once writable again")
        warnings = {f"{p.command}-{i}": p.log.read_text().count("dependency unavailable")
                    for i, p in enumerate(procs.started)}
        for role in procs.started:
            role.terminate()
        ended = {f"{p.command}-{i}": (p.wait_exit(30), p.tail(5)) for i, p in enumerate(procs.started)}
        assert {code for code, _ in ended.values()} == {0}, ended
    finally:
        procs.close()
    # One warning per outage: the switch to read-only, and maybe the sessions ended by the switch back.
    assert all(n <= 2 for name, n in warnings.items() if name.startswith("process-")), warnings
    assert late.proc.returncode == 0
    assert warnings[f"relay-{WORKERS}"] <= 2 and relay.proc.returncode == 0, warnings
    assert_applied_once_each(pipeline, len(ids))
    assert read_topic(pipeline.settings.kafka.bootstrap_servers, pipeline.settings.topology.dlq) == []


def _exited(procs: RoleProcesses) -> list[tuple[str, int | None, str]]:
    """The role processes that ended, with their exit code and last lines."""
    return [(p.command, p.proc.returncode, p.tail()) for p in procs.started if p.proc.poll() is not None]


@pytest.mark.alone  # its bound is seconds after the connection: no second worker's load beside it
def test_a_database_that_never_answers_fails_every_command_within_the_connect_timeout(kafka_bootstrap, tmp_path):
    """One command at a time, so each is timed from its own connection attempt (interpreter
    start-up before it varies with the machine's load; the connect timeout must not)."""
    timeout_s = 2
    with silent_listener() as db:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAPSE_")},
               env_var("kafka.bootstrap_servers"): kafka_bootstrap,
               env_var("database.url"): f"postgresql+psycopg://lapse:s3cret-Pw@127.0.0.1:{db.port}/lapse",
               env_var("database.connect_timeout_s"): str(timeout_s),
               env_var("kinds.file"): str(packaged_kinds_file())}
        for args in (["status"], ["db", "current"], ["sweep", "--once"], ["process", "--exit-when-idle", "1"]):
            seen = len(db.arrivals)
            proc = subprocess.Popen([sys.executable, "-m", "lapse", *args], env=env, cwd=tmp_path, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                _, err = proc.communicate(timeout=timeout_s + MARGIN_S + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                pytest.fail(f"lapse {' '.join(args)} hung on a database that never answers")
            ended = time.monotonic()
            lines = err.splitlines()
            what = f"lapse {' '.join(args)}: exit {proc.returncode}, stderr {lines}"
            assert (proc.returncode, len(lines)) == (ExitCode.UNREACHABLE, 1), what
            assert lines[0].startswith("lapse: database ") and "s3cret-Pw" not in lines[0], what
            assert len(db.arrivals) > seen, f"{what}: never connected"
            took = ended - db.arrivals[seen]
            assert took < timeout_s + MARGIN_S, f"{what}: {took:.1f}s after it connected"
