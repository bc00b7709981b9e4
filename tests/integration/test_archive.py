"""The archive writes exactly the topics' records (Apache Kafka, PostgreSQL, a folder): two `lapse
archive` members, one SIGKILLed every 2 to 4 seconds and started again while records keep arriving,
then one run to idle — and every partition's manifest is one chain from offset 0 whose files hold
the topic's records, record for record (offset, timestamp, key, value, headers), none twice; the
ledger's transitions are archived row for row. `lapse status` shows how far the archive lags. And
the two crash windows of the commit order, hit on purpose: a file stored but no manifest entry yet
is replaced by the next run, never appended to; an entry written but no offset committed is
resumed after, not written again."""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from sqlalchemy import select

from lapse.devtools.demo_data import add_reservations
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event
from lapse.kernel.models import ledger_transitions
from lapse.kernel.settings import REPO_ROOT
from lapse.shell.app import main
from tests.fixtures.archive import archive_rows, archived_transitions, produce_spread, topic_rows
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.processes import RoleProcesses, role_env, run_lapse
from tests.fixtures.readers import READER_TOPICS, produce_events, relay, sweep
from tests.fixtures.workers import process_until_done

KILLING_S = 12.0  # how long members are SIGKILLed and restarted
# One-second files; and a member killed while it joins the group is given up after 10 s, not after
# the default max.poll.interval.ms (Kafka waits that long for a member that sent its JoinGroup).
ARCHIVE = {"archive.file_span_s": 1, "archive.close_after_s": 0, "processor.max_poll_interval_ms": 10_000}


def _history(settings, pg_url: str) -> None:
    """A real history: 30 reservations swept, applied and their outcomes relayed, one dead letter."""
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        add_reservations(conn, 30, expires_at=datetime.now(UTC) - timedelta(minutes=10))
    engine.dispose()
    sweep(settings)
    produce_events(settings, [expiry_event("release-reservation", "not-a-number", "t1",
                                           datetime.now(UTC) - timedelta(minutes=5), source="sweep")])
    process_until_done(settings, terminal=31)
    relay(settings)


def _trickle(settings, stop: threading.Event) -> None:
    """Records arriving while the members are killed: one every 20 ms on each archived topic."""
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "linger.ms": 5})
    i = 0
    while not stop.is_set():
        for topic in (settings.topology.expiry, settings.topology.outcomes, settings.topology.dlq):
            producer.produce(topic, key=f"live-{i}".encode(), value=f"live {i}".encode())
        i += 1
        producer.poll(0)
        stop.wait(0.02)
    assert producer.flush(30) == 0


@pytest.mark.slow
def test_the_archive_equals_the_topics_through_sigkills_and_rebalances(kafka_bootstrap, pg_url, unique, tmp_path):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    _history(settings, pg_url)
    produce_spread(settings, per_topic=200, over_s=60)
    url = f"file://{tmp_path / 'archive'}"
    (tmp_path / "logs").mkdir()
    members = RoleProcesses(settings, tmp_path / "logs", **{"archive.url": url, **ARCHIVE})
    stop = threading.Event()
    trickle = threading.Thread(target=_trickle, args=(settings, stop), daemon=True)
    rng = random.Random(26)
    kills = 0
    try:
        members.start("archive")
        members.start("archive")
        trickle.start()
        deadline = time.monotonic() + KILLING_S
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(2.0, 4.0))
            working = [m for m in members.running("archive") if m.said("partitions assigned partitions=['")]
            victim = rng.choice(working or members.running("archive"))
            victim.kill()  # SIGKILL: no revoke, no close, a file may be half written
            kills += 1
            members.start("archive")
    finally:
        stop.set()
        trickle.join(30)
        members.close()
    assert kills >= 3

    # The last members were killed just now, some while joining: the run to idle waits until their
    # sessions expired and the group handed it every partition.
    (done,) = run_lapse(["archive", "--exit-when-idle", "2", "--json"],
                        env=role_env(settings, **{"archive.url": url, **ARCHIVE}), cwd=REPO_ROOT, bound_s=90)
    assert done.code == 0, done.stderr[-10:]
    (tmp_path / "logs" / "final-archive.log").write_text("\n".join(done.stderr))

    for topic, partitions in ((settings.topology.expiry, 3), (settings.topology.outcomes, 3),
                              (settings.topology.dlq, 1)):
        on_topic = topic_rows(settings, topic)
        assert archive_rows(settings, url, topic, partitions) == on_topic, (topic, done.stderr[-20:])
        assert sum(len(rows) for rows in on_topic.values()) >= 200
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(ledger_transitions).order_by(ledger_transitions.c.id))]
    engine.dispose()
    archived = archived_transitions(settings, url)
    assert [(t["id"], t["op_key"], t["to_state"], t["at"]) for t in archived] == [
        (t["id"], t["op_key"], t["to_state"], t["at"]) for t in rows]
    assert len(rows) >= 31  # pending -> applied for 30, one dead letter

    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    status = json.loads(CliRunner().invoke(main, ["status", "--json"], env=env).stdout)
    lag = [row for row in status["lag"] if row["group"] == settings.topology.groups.archive]
    assert {row["topic"] for row in lag} == {settings.topology.expiry, settings.topology.outcomes,
                                             settings.topology.dlq}
    assert all(row["records"] == 0 for row in lag), lag
    assert status["findings"]["archive"]["lag_s"] is not None


@pytest.mark.slow
def test_a_crash_inside_the_commit_order_neither_loses_nor_repeats_a_file(kafka_bootstrap, pg_url, unique, tmp_path):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    produce_spread(settings, per_topic=40, over_s=10)
    folder = tmp_path / "archive"
    env = role_env(settings, **{"archive.url": f"file://{folder}", **ARCHIVE})

    def run(crash: str | None) -> int:
        extra = {"LAPSE_DEV__CRASH_POINT": crash} if crash else {}
        (done,) = run_lapse(["archive", "--exit-when-idle", "2"], env={**env, **extra}, cwd=REPO_ROOT, bound_s=60)
        return done.code

    def stored() -> tuple[list[str], list[dict]]:
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.avro"))
        entries = [json.loads(p.read_text()) for p in folder.rglob("manifest/*.json")]
        return files, entries

    assert run("archive_after_file") == 17  # the file is stored, its manifest entry is not
    orphan, entries = stored()
    assert (len(orphan), [e for e in entries if e["file"]]) == (1, [])
    assert run("archive_after_manifest") == 17  # the entry is written, the group's offset is not
    files, entries = stored()
    (entry,) = [e for e in entries if e["file"]]
    assert set(files) == {*orphan, entry["file"]}
    assert run(None) == 0
    files, entries = stored()
    # The orphan's offsets went to the same file again (replaced, not a second one); the entry's file
    # was not written again: every stored file is in the manifest, once.
    assert set(orphan) <= set(files) and files == sorted(e["file"] for e in entries if e["file"])
    for topic, partitions in ((settings.topology.expiry, 3), (settings.topology.outcomes, 3),
                              (settings.topology.dlq, 1)):
        assert archive_rows(settings, f"file://{folder}", topic, partitions) == topic_rows(settings, topic)
