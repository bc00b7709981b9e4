"""The declared `kafka-produce` effect on Apache Kafka and PostgreSQL: one record per op key on the
declared effect topic, as a read_committed reader sees it, across duplicate events, redeliveries
and a worker SIGKILLed between its produce and its commit; produce errors sorted into failure
classes by the real broker; and `lapse kinds check` refusing, in one line, a topic the topics
file does not declare with role `effect`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient
from sqlalchemy import Column, DateTime, select

from lapse.kernel.database import make_engine
from lapse.kernel.kinds import CleanupKind, compile_kinds, read_kinds_file
from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.kinds.effects.kafka_produce import KafkaProduceEffect
from lapse.kernel.ledger import ExpiryEvent, expiry_event
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.settings import Settings, env_var, load_settings
from lapse.kernel.topology import load_topology
from lapse.processors.effect_calls import callers_from_settings
from lapse.processors.effects.kafka_produce import KafkaProduceCaller
from lapse.processors.failures import INVALID, EffectFailure
from lapse.processors.leased import EffectRunner, run_leased
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchScope
from lapse.shell.app import main
from tests.fixtures.effects import due_rows_table
from tests.fixtures.kafka import create_topics, read_topic
from tests.fixtures.pipeline import make_pipeline_settings
from tests.fixtures.readers import produce_events
from tests.fixtures.topology import TOPICS_FILE
from tests.fixtures.workers import process_until_done

KIND = "erase-profile"
EFFECT_TOPIC = "lapse.effects.erasures"
LEASE = timedelta(seconds=30)
PARTITIONS = 3

erasures = due_rows_table("erasures", "requested", Column("erased_at", DateTime(timezone=True)))


def topics_file(folder: Path, **effect_config: str) -> Path:
    """The repository's topics.yaml with one topic of role effect added."""
    doc = yaml.safe_load(TOPICS_FILE.read_text())
    doc["topics"][EFFECT_TOPIC] = {"role": "effect", "partitions": PARTITIONS, "retention": "1d",
                                   **({"config": effect_config} if effect_config else {})}
    path = folder / "topics.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def kinds_file(folder: Path, topic: str = EFFECT_TOPIC) -> Path:
    path = folder / "kinds.yaml"
    path.write_text(yaml.safe_dump({"kinds": {KIND: {
        "table": "public.erasures", "id": "id", "tenant": "tenant", "due": "due_at",
        "eligible": {"status": "requested"},
        "effect": {"kafka-produce": {"topic": topic, "timeout_s": 10,
                                     "then_set": {"status": "erased", "erased_at": "now"}}},
        "retry": {"max_attempts": 3, "base_s": 1.0, "cap_s": 5.0},
    }}}))
    return path


def make_settings(conf: dict[str, str]) -> Settings:
    return load_settings(kafka={"bootstrap_servers": conf["bootstrap"]}, database={"url": conf["db"]},
                         topics={"file": conf["topics"], "prefix": conf["prefix"]}, kinds={"file": conf["kinds"]})


def kinds_of(settings: Settings, engine) -> dict[str, CleanupKind]:
    return compile_kinds(read_kinds_file(settings.kinds.file), engine, topology=settings.topology)


def events_for(subjects: list[int], now: datetime) -> list[ExpiryEvent]:
    return [expiry_event(KIND, s, "t1", now - timedelta(hours=1), source="sweep", correlation_id=f"c{s}")
            for s in subjects]


@pytest.fixture
def env(kafka_bootstrap, pg_url, unique, tmp_path) -> dict[str, str]:
    """A fresh environment: its own topic prefix with the effect topic created, and the table."""
    conf = {"bootstrap": kafka_bootstrap, "db": pg_url, "prefix": unique("lapse") + ".",
            "topics": str(topics_file(tmp_path)), "kinds": str(kinds_file(tmp_path))}
    create_topics(kafka_bootstrap, {conf["prefix"] + EFFECT_TOPIC: PARTITIONS})
    engine = make_engine(pg_url)
    erasures.create(engine)
    engine.dispose()
    return conf


def add_rows(engine, subjects: list[int], now: datetime) -> None:
    with engine.begin() as conn:
        conn.execute(erasures.insert(), [{"id": s, "tenant": "t1", "status": "requested",
                                          "due_at": now - timedelta(hours=1)} for s in subjects])


def deliver(settings: Settings, engine, kinds, events: list[ExpiryEvent], now: datetime, worker: str):
    """One delivery of `events` as a worker makes it: claim, produce under the lease, complete."""
    runner = EffectRunner(callers_from_settings(settings), concurrency=2)
    try:
        with engine.connect() as conn:
            scope = BatchScope(conn, kinds=kinds, topics=settings.topology, worker=worker, now=now, lease=LEASE,
                               rng=random.Random(1))
            with conn.begin():
                claimed = apply_batch(scope, events)
            return run_leased(runner, scope, claimed, lambda: now)
    finally:
        runner.close()


def committed_records(settings: Settings) -> list[Any]:
    """Every record of the effect topic as a read_committed reader sees it, to the end."""
    return read_topic(settings.kafka.bootstrap_servers, settings.topology.effect_topics[0],
                      extra={"isolation.level": "read_committed"})


def by_op_key(records: list[Any]) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for r in records:
        headers = {k: v.decode() for k, v in r.headers() or []}
        assert r.key().decode() == headers["lapse-op-key"]
        out.setdefault(r.key().decode(), []).append({**headers, **json.loads(r.value())})
    return out


def ledger(engine) -> dict[str, tuple[str, int]]:
    with engine.connect() as conn:
        return {r.op_key: (r.state, r.attempt) for r in conn.execute(select(cleanup_ledger))}


def statuses(engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(erasures.c.id, erasures.c.status)).all())


def test_one_record_per_op_key_across_duplicate_events_and_redeliveries(env):
    settings = make_settings(env)
    engine = make_engine(env["db"])
    now = datetime.now(UTC)
    add_rows(engine, [1, 2, 3], now)
    kinds = kinds_of(settings, engine)
    events = events_for([1, 2, 3], now)
    first = deliver(settings, engine, kinds, events + events, now, "w1")  # each event twice in the batch
    assert sorted(first.applied) == sorted(e.op_key for e in events)
    again = deliver(settings, engine, kinds, events, now + timedelta(seconds=1), "w2")  # redelivered
    assert again.applied == [] and again.leased == []
    records = by_op_key(committed_records(settings))
    assert {key: [(r["lapse-attempt"], r["subject_id"], r["kind"]) for r in rs] for key, rs in records.items()} == {
        e.op_key: [("1", e.subject_id, KIND)] for e in events}
    assert ledger(engine) == {e.op_key: ("applied", 1) for e in events}
    assert statuses(engine) == {1: "erased", 2: "erased", 3: "erased"}
    engine.dispose()


def test_a_cleanup_worker_produces_once_per_op_key_from_duplicate_events_on_the_expiry_topic(
        kafka_bootstrap, pg_url, unique, tmp_path):
    """The whole path: each event twice on the expiry topic, a CleanupWorker consuming them, then
    the same events delivered again to a second worker: one record per op key on the effect topic."""
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, topics={"file": str(topics_file(tmp_path))},
                                      kinds={"file": str(kinds_file(tmp_path))})
    create_topics(kafka_bootstrap, {settings.topology.effect_topics[0]: PARTITIONS})
    engine = make_engine(pg_url)
    erasures.create(engine)
    now = datetime.now(UTC)
    add_rows(engine, [1, 2, 3, 4], now)
    events = events_for([1, 2, 3, 4], now)
    produce_events(settings, events + events)
    process_until_done(settings, terminal=len(events))
    produce_events(settings, events)  # redelivered, as a reconciler re-emit or a rewind would
    process_until_done(settings, terminal=len(events))
    records = by_op_key(committed_records(settings))
    assert {key: [r["lapse-attempt"] for r in rs] for key, rs in records.items()} == {e.op_key: ["1"] for e in events}
    assert ledger(engine) == {e.op_key: ("applied", 1) for e in events}
    assert set(statuses(engine).values()) == {"erased"}
    engine.dispose()


def crash_after_produce(conf: dict[str, str], now_iso: str, produce: list[int]) -> None:
    """A worker (its own process) that claims subjects 1 and 2, produces the records of `produce`
    (waiting for their delivery reports) and is SIGKILLed before it commits anything more."""
    settings = make_settings(conf)
    engine = make_engine(conf["db"])
    now = datetime.fromisoformat(now_iso)
    kinds = kinds_of(settings, engine)
    with engine.connect() as conn:
        scope = BatchScope(conn, kinds=kinds, topics=settings.topology, worker="wa", now=now, lease=LEASE,
                           rng=random.Random(1))
        with conn.begin():
            claimed = apply_batch(scope, events_for([1, 2], now))
    runner = EffectRunner(callers_from_settings(settings), concurrency=1)
    jobs = [(kinds[e.kind], EffectCall(e.kind, e.op_key, claimed.attempts[e.op_key], e.subject_id, e.tenant,
                                       claimed.targets[e.op_key]))
            for e in claimed.leased if int(e.subject_id) in produce]
    outcomes = runner.run(jobs, LEASE.total_seconds(), lambda keys: None)
    if outcomes != {e.op_key: None for e in events_for(produce, now)}:
        os._exit(3)  # the produce did not land: the test cannot show what it means to
    os.kill(os.getpid(), signal.SIGKILL)


def test_one_record_per_op_key_after_a_sigkill_between_produce_and_commit(env):
    """wa produces subject 1's record and is killed before recording it; it dies before producing
    subject 2's. wb takes both over after the lease: subject 1's record is already on the topic
    (wb finds it and does not produce again), subject 2's is produced by wb, once."""
    settings = make_settings(env)
    engine = make_engine(env["db"])
    now = datetime.now(UTC)
    add_rows(engine, [1, 2], now)
    worker = multiprocessing.get_context("spawn").Process(target=crash_after_produce, args=(env, now.isoformat(), [1]))
    worker.start()
    worker.join(120)
    assert worker.exitcode == -signal.SIGKILL, worker.exitcode
    events = events_for([1, 2], now)
    assert ledger(engine) == {e.op_key: ("claimed", 0) for e in events}  # nothing recorded
    assert set(by_op_key(committed_records(settings))) == {events[0].op_key}

    kinds = kinds_of(settings, engine)
    later = now + LEASE + timedelta(seconds=1)
    taken = deliver(settings, engine, kinds, events, later, "wb")
    assert sorted(taken.applied) == sorted(e.op_key for e in events)
    again = deliver(settings, engine, kinds, events + events, later + timedelta(seconds=1), "wc")  # duplicates
    assert again.applied == []

    records = by_op_key(committed_records(settings))
    assert {key: [r["lapse-attempt"] for r in rs] for key, rs in records.items()} == {
        events[0].op_key: ["1"],  # wa's, found by wb's check
        events[1].op_key: ["2"],  # wb's: wa never produced it
    }
    assert ledger(engine) == {e.op_key: ("applied", 2) for e in events}
    assert statuses(engine) == {1: "erased", 2: "erased"}
    engine.dispose()


def test_a_record_too_large_for_the_topic_is_an_invalid_failure_at_once(kafka_bootstrap, pg_url, unique, tmp_path):
    """The broker refuses the record (the topic's max.message.bytes): a dead letter of class
    invalid on the first attempt, nothing on the topic, the business row left alone."""
    conf = {"bootstrap": kafka_bootstrap, "db": pg_url, "prefix": unique("lapse") + ".",
            "topics": str(topics_file(tmp_path, **{"max.message.bytes": "64"})), "kinds": str(kinds_file(tmp_path))}
    create_topics(kafka_bootstrap, {conf["prefix"] + EFFECT_TOPIC: PARTITIONS}, config={"max.message.bytes": "64"})
    engine = make_engine(pg_url)
    erasures.create(engine)
    settings = make_settings(conf)
    now = datetime.now(UTC)
    add_rows(engine, [1], now)
    [event] = events_for([1], now)
    result = deliver(settings, engine, kinds_of(settings, engine), [event], now, "w1")
    assert result.applied == []
    with engine.connect() as conn:
        row = conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == event.op_key)).mappings().one()
    assert (row["state"], row["attempt"], row["last_failure_class"]) == ("dead_letter", 1, INVALID)
    assert "MSG_SIZE_TOO_LARGE" in row["last_failure"]
    assert committed_records(settings) == []
    assert statuses(engine) == {1: "requested"}
    engine.dispose()


def test_a_topic_missing_on_the_broker_is_an_invalid_failure_and_is_not_created(env):
    """A declared effect topic that `topics apply` never created: the call fails invalid (no retry
    cures it) and the producer does not create the topic by producing to it."""
    settings = make_settings(env)
    missing = KafkaProduceEffect(topic=env["prefix"] + "lapse.effects.never-created", timeout_s=5)
    caller = KafkaProduceCaller(missing, settings)
    try:
        with pytest.raises(EffectFailure) as caught:
            caller(EffectCall(KIND, f"{KIND}:1", 1, "1", "t1", {}))
    finally:
        caller.close()
    assert caught.value.failure_class == INVALID and "UNKNOWN_TOPIC" in caught.value.reason, caught.value.reason
    assert missing.topic not in AdminClient({"bootstrap.servers": env["bootstrap"]}).list_topics(timeout=10).topics


def test_kinds_check_refuses_a_topic_not_declared_with_role_effect_in_one_line(env, tmp_path):
    base = {env_var("database.url"): env["db"], env_var("topics.file"): env["topics"],
            env_var("topics.prefix"): env["prefix"]}
    good = CliRunner().invoke(main, ["kinds", "check"], env={**base, env_var("kinds.file"): env["kinds"]})
    assert good.exit_code == 0, good.output
    dlq = next(spec.declared_name for spec in load_topology(TOPICS_FILE).specs if spec.role == "dlq")
    for topic, why in [("lapse.effects.nowhere", "is not declared in the topics file (declare it with role: effect)"),
                       (dlq, "has role dlq in the topics file, not role: effect")]:
        folder = tmp_path / topic
        folder.mkdir()
        bad = CliRunner().invoke(main, ["kinds", "check"],
                                 env={**base, env_var("kinds.file"): str(kinds_file(folder, topic))})
        assert bad.exit_code == 1, bad.output
        failed = [line for line in bad.output.splitlines() if line.startswith("FAILED")]
        assert failed == [f"FAILED  {KIND}: effect.kafka-produce.topic: {topic!r} {why}"], bad.output


def test_the_worker_settings_carry_the_topic_with_its_prefix(env):
    settings = make_settings(env)
    engine = make_engine(env["db"])
    effect = kinds_of(settings, engine)[KIND].external_effect
    assert effect is not None and effect.declared is not None
    assert effect.declared.topic == env["prefix"] + EFFECT_TOPIC  # type: ignore[attr-defined]
    engine.dispose()
