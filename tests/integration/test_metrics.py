"""Prometheus metrics scraped over HTTP: a single process's counters after a real batch (sweep,
worker, Apache Kafka, PostgreSQL); the status samples read at scrape time (cached, no stale label,
an unreachable database a sample rather than an error); and one endpoint for a supervised process
tree, summing its role processes' counters and forgetting a restarted process's live gauges."""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert

from lapse.devtools.brokers import free_port
from lapse.devtools.demo_data import add_reservations
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event, pending_row
from lapse.kernel.models import cleanup_ledger
from lapse.processors.metrics import EVENTS_CONSUMED
from lapse.readers.status import status_report
from lapse.shell import metrics
from lapse.shell.roles import pipeline_roles
from lapse.shell.signals import stop_on_signals
from lapse.shell.status_collector import StatusCollector, status_reader
from lapse.shell.supervisor import Child, Supervisor
from tests.fixtures.pipeline import make_pipeline_settings
from tests.fixtures.polling import eventually
from tests.fixtures.processes import RoleProcesses
from tests.fixtures.readers import READER_TOPICS, produce_events, sweep
from tests.fixtures.workers import process_until_done

# The stated bound: `lapse run` and every role are gone within this of one SIGTERM (the shutdown grace
# is 25 s).
EXIT_BOUND_S = 30.0


def scrape(port: int) -> dict[tuple, float]:
    """(sample name, sorted labels) → value, from the live /metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape_when_up(port: int) -> dict[tuple, float]:
    """A scrape, or nothing while the endpoint is not listening yet."""
    try:
        return scrape(port)
    except (urllib.error.URLError, ConnectionError):
        return {}


def samples(scraped: dict[tuple, float], name: str) -> dict[tuple, float]:
    """The samples of one name: sorted labels → value."""
    return {labels: value for (n, labels), value in scraped.items() if n == name}



def scrape_collector(collector: StatusCollector) -> dict[tuple, float]:
    """One scrape over HTTP of a registry holding only `collector`, served on a free loopback port."""
    registry = CollectorRegistry()
    registry.register(collector)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        return scrape(port)
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_after_a_real_batch(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS,
                                      runtime={"metrics_port": free_port()})
    port = metrics.serve(settings)
    before = scrape(port)
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        add_reservations(conn, 3, expires_at=now - timedelta(minutes=10))
    sweep(settings)
    bad = expiry_event("release-reservation", "x1", "t1", now, source="sweep", correlation_id="c")
    produce_events(settings, [bad, bad])  # an invalid subject, delivered twice
    process_until_done(settings, terminal=4)

    after = scrape(port)

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("lapse_events_consumed_total") == 5
    assert delta("lapse_effects_applied_total") == 3
    assert delta("lapse_dead_letters_total", failure_class="ledger") == 1
    assert delta("lapse_duplicates_absorbed_total") == 1
    batches = delta("lapse_batch_size_count")
    assert batches >= 1 and delta("lapse_batch_seconds_count") == batches
    assert delta("lapse_batch_size_sum") == 5

    # The status samples, read from this database when scraped: a stuck pending row ten minutes
    # overdue, and the group caught up.
    event = expiry_event("release-reservation", 999, "t1", now - timedelta(minutes=10), source="sweep",
                         correlation_id="c")
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), [pending_row(event, now)])
    gauges = scrape_collector(StatusCollector(lambda: status_report(settings, engine, now)))
    assert gauges[("lapse_status_up", ())] == 1
    assert gauges[("lapse_oldest_eligible_age_seconds", ())] == 600
    assert gauges[("lapse_ledger_rows", (("state", "applied"),))] == 3
    assert gauges[("lapse_ledger_rows", (("state", "pending"),))] == 1
    assert gauges[("lapse_ledger_rows", (("state", "dead_letter"),))] == 1
    assert gauges[("lapse_ledger_rows", (("state", "claimed"),))] == 0  # every state, 0 when empty
    lag = (("group", settings.topology.groups.cleanup), ("topic", settings.topology.expiry))
    assert gauges[("lapse_consumer_lag_records", lag)] == 0
    assert gauges[("lapse_consumer_lag_readable", lag)] == 1
    assert gauges[("lapse_group_members", (("group", settings.topology.groups.cleanup),))] == 0  # stopped
    assert gauges[("lapse_dead_letter_circuits_open", ())] == 0
    assert ("lapse_outbox_unsent", ()) in gauges
    engine.dispose()


def _report(ledger: dict, lag: list) -> dict:
    return {"oldest_eligible_age_s": None, "expired_claims": {"count": 0}, "ledger": ledger,
            "outbox": {"unsent": 2, "oldest_unsent_age_s": 7.5}, "lag": lag, "eligible": None}


def test_the_status_collector_reads_once_per_max_age_and_keeps_no_stale_series():
    """Scrapes within `max_age_s` share one reading; a later reading's samples replace the
    earlier ones whole: a (group, topic) gone or unreadable has no lag sample, an emptied state 0."""
    readings = [
        _report({"pending": {"a": 2, "b": 3}, "applied": {"a": 7}},
                [{"group": "g1", "topic": "t", "records": 5, "seconds": 1.0},
                 {"group": "g2", "topic": "t", "records": 6, "seconds": 2.0}]),
        _report({"applied": {"a": 9}}, [{"group": "g1", "topic": "t", "error": "broker away"}]),
    ]
    read_count = []

    def read() -> dict:
        read_count.append(1)
        return readings[len(read_count) - 1]

    clock = [100.0]
    registry = CollectorRegistry()
    registry.register(StatusCollector(read, max_age_s=5.0, clock=lambda: clock[0]))
    assert not read_count  # registering reads nothing

    def value(name: str, **labels) -> float | None:
        return registry.get_sample_value(name, labels)

    assert (value("lapse_ledger_rows", state="pending"), value("lapse_ledger_rows", state="applied")) == (5, 7)
    assert (value("lapse_consumer_lag_records", group="g1", topic="t"),
            value("lapse_consumer_lag_records", group="g2", topic="t")) == (5, 6)
    assert value("lapse_outbox_oldest_unsent_age_seconds") == 7.5
    clock[0] += 4.9
    assert value("lapse_status_up") == 1
    assert len(read_count) == 1  # six scrapes, one reading
    clock[0] += 0.2
    assert (value("lapse_ledger_rows", state="pending"), value("lapse_ledger_rows", state="applied")) == (0, 9)
    assert len(read_count) == 2
    assert (value("lapse_consumer_lag_records", group="g1", topic="t"),
            value("lapse_consumer_lag_records", group="g2", topic="t")) == (None, None)
    assert value("lapse_consumer_lag_readable", group="g1", topic="t") == 0
    assert value("lapse_consumer_lag_readable", group="g2", topic="t") is None


def test_an_unreachable_database_is_a_status_up_0_sample(kafka_bootstrap, pg_url, unique):
    """The database away: /metrics answers, with `lapse_status_up 0` and no status figure."""
    away = f"postgresql+psycopg://lapse@127.0.0.1:{free_port()}/lapse"
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    engine = make_engine(away)
    try:
        scraped = scrape_collector(StatusCollector(status_reader(settings, engine)))
    finally:
        engine.dispose()
    assert scraped[("lapse_status_up", ())] == 0
    assert not samples(scraped, "lapse_ledger_rows") and not samples(scraped, "lapse_oldest_eligible_age_seconds")


def count_events(settings, *, events: int) -> None:
    """A role that counts `events` consumed events, then waits for SIGTERM."""
    stop = stop_on_signals()
    EVENTS_CONSUMED.inc(events)
    stop.wait(120)


def test_one_endpoint_sums_the_role_processes_and_forgets_a_restarted_one(kafka_bootstrap, pg_url, unique):
    """Two role processes under the supervisor, one metrics port: their counters summed, the
    status samples once, each role's liveness; after one role is killed and restarted, its
    counts stay in the sum and only the live processes have a start-time series."""
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS,
                                      runtime={"metrics_port": free_port()})
    port = settings.runtime.metrics_port
    roles = [Child("a", partial(count_events, events=3)), Child("b", partial(count_events, events=4))]
    sup = Supervisor(settings, roles, restart_delay_s=0.1, grace_s=10)
    sup.start()
    watching = threading.Thread(target=sup.watch, kwargs={"poll_s": 0.1}, daemon=True)
    watching.start()
    try:
        scraped = eventually(lambda: (s := scrape(port)).get(("lapse_events_consumed_total", ())) == 7 and s,
                             timeout_s=30, what="both roles' counts on the one endpoint")
        started = samples(scraped, "lapse_role_start_time_seconds")
        pids = {dict(labels)["role"]: dict(labels)["pid"] for labels in started}
        assert pids == {"a": str(sup.procs["a"].pid), "b": str(sup.procs["b"].pid)}
        assert samples(scraped, "lapse_role_up") == {(("role", "a"),): 1, (("role", "b"),): 1}
        assert scraped[("lapse_status_up", ())] == 1  # the status samples, served by the supervisor
        assert scraped[("lapse_ledger_rows", (("state", "applied"),))] == 0
        assert len(samples(scraped, "lapse_status_up")) == 1

        old = sup.procs["a"]
        old.kill()
        eventually(lambda: sup.procs["a"] is not old and sup.procs["a"].is_alive(), timeout_s=30,
                   what="role a restarted")
        scraped = eventually(lambda: (s := scrape(port)).get(("lapse_events_consumed_total", ())) == 10 and s,
                             timeout_s=30, what="the restarted role's count added to the dead one's")
        started = samples(scraped, "lapse_role_start_time_seconds")
        assert {dict(labels)["pid"] for labels in started} == {str(sup.procs["a"].pid), str(sup.procs["b"].pid)}
        assert str(old.pid) not in {dict(labels)["pid"] for labels in started}
        assert scraped[("lapse_role_restarts_total", (("role", "a"),))] == 1
        assert scraped[("lapse_role_restarts_total", (("role", "b"),))] == 0
    finally:
        sup.stop.set()
        watching.join(10)
        assert sup.shutdown() == []
    assert sup.multiproc_dir is None  # the metric files went with the tree


@pytest.mark.slow
def test_lapse_run_serves_every_role_and_the_status_on_one_port(kafka_bootstrap, pg_url, unique, tmp_path):
    """The real `lapse run --metrics-port P`: due reservations swept and applied, counted on P with
    each running role's process there once and the status read by the supervisor (no monitor
    role); one SIGTERM stops every role and the run exits 0 within `EXIT_BOUND_S`. (One processor:
    a second one's join adds a rebalance, and the sum over processes is the test above.)"""
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, expiry_partitions=2)
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        add_reservations(conn, 3, expires_at=datetime.now(UTC) - timedelta(minutes=10))
    engine.dispose()
    port = free_port()
    procs = RoleProcesses(settings, tmp_path, runtime__metrics_port=port, producer__sweep_interval_s=1,
                          archive__url=f"file://{tmp_path / 'archive'}")
    run = procs.start("run", "--workers", "1")
    roles = {role.name for role in pipeline_roles(1, archive=True)}  # archive.url is set: the archive runs too

    def settled() -> dict[tuple, float] | None:
        assert run.proc.poll() is None, run.tail()
        s = scrape_when_up(port)
        up = {dict(labels)["role"]: v for labels, v in samples(s, "lapse_role_up").items()}
        done = (s.get(("lapse_effects_applied_total", ())) == 3 and set(up) == roles
                and up["process-0"] == up["sweep"] == 1
                and s.get(("lapse_ledger_rows", (("state", "applied"),))) == 3)
        return s if done else None

    try:
        scraped = eventually(settled, timeout_s=90, interval_s=0.5,
                             what="3 effects applied, the processor up, on one port")
        running = {dict(labels)["role"] for labels, v in samples(scraped, "lapse_role_up").items() if v == 1}
        started = [dict(labels) for labels in samples(scraped, "lapse_role_start_time_seconds")]
        assert sorted(s["role"] for s in started) == sorted(running)  # one process per running role
        children = {int(s["pid"]) for s in started}
        assert len(children) == len(running)
        assert "monitor" not in roles and scraped[("lapse_status_up", ())] == 1
        assert scraped[("lapse_events_consumed_total", ())] == 3
    finally:
        if run.proc.poll() is None:
            run.terminate()  # the supervisor stops its roles (a SIGKILL would orphan them)
        code = run.wait_exit(EXIT_BOUND_S)
        procs.close()
    # One SIGTERM stopped every role within the bound (none had to be killed) and none outlived it.
    assert code == 0, f"lapse run: not exit 0 within {EXIT_BOUND_S:g} s of SIGTERM: {code}\n{run.tail()}"
    assert not [pid for pid in children if alive(pid)], "a role outlived `lapse run`"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_lapse_status_watch_serves_the_status_samples(kafka_bootstrap, pg_url, unique, tmp_path):
    """`lapse status --watch` (compose's monitor service) serves the status read at scrape time."""
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    event = expiry_event("release-reservation", 7, "t1", now - timedelta(minutes=10), source="sweep",
                         correlation_id="c")
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), [pending_row(event, now)])
    engine.dispose()
    port = free_port()
    procs = RoleProcesses(settings, tmp_path, runtime__metrics_port=port)
    watch = procs.start("status", "--watch", "5")
    try:
        scraped = eventually(lambda: (s := scrape_when_up(port)).get(("lapse_status_up", ())) == 1 and s,
                             timeout_s=60, what="the status samples served")
        assert scraped[("lapse_ledger_rows", (("state", "pending"),))] == 1
        assert scraped[("lapse_oldest_eligible_age_seconds", ())] >= 600
        watch.terminate()
        assert watch.wait_exit(30) == 0, watch.tail()
    finally:
        procs.close()
