"""`lapse dlq list` shows both kinds of dead letters: the ledger's (an operation that failed for
good) and the poison records, which exist only on the DLQ topic (no ledger row could be made for
them), read from the topic to its end and marked `poison`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from confluent_kafka import Producer

from lapse.kernel.ledger import expiry_event, expiry_record
from lapse.shell.app import main
from tests.fixtures.pipeline import connection_env
from tests.fixtures.workers import process_until_done

NOW = datetime.now(UTC)


def record(codec, kind, subject, tenant="t1") -> bytes:
    event = expiry_event(kind, subject, tenant, NOW - timedelta(minutes=5), source="sweep", correlation_id="c")
    return codec.encode("expiry_event", expiry_record(event, NOW))


def test_list_shows_the_ledgers_dead_letters_and_the_poison_on_the_topic(pipeline):
    s, codec = pipeline.settings, pipeline.codec
    values = [
        b"\x07garbage",                                     # poison: not Avro, no ledger row
        record(codec, "release-reservation", "x1"),          # a ledger dead letter: invalid subject
        b"\xc3\x01" + bytes(8) + b"garbage",                 # poison: unknown fingerprint
    ]
    producer = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
    for value in values:
        producer.produce(s.topology.expiry, key=b"k", value=value, partition=0)
    assert producer.flush(10) == 0
    stats = process_until_done(s)
    assert stats.poison == 2

    env = {**connection_env(s), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    runner = CliRunner()
    result = runner.invoke(main, ["dlq", "list", "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["dead_letters"]
    ledger = [r for r in rows if not r["poison"]]
    poison = [r for r in rows if r["poison"]]
    assert [(r["op_key"], r["last_failure_class"]) for r in ledger] == [("release-reservation:x1", "invalid")]
    assert [(r["source"]["topic"], r["source"]["partition"], r["source"]["offset"]) for r in poison] == [
        (s.topology.expiry, 0, 0), (s.topology.expiry, 0, 2)]
    assert [r["last_failure"].split(":")[0] for r in poison] == ["bad_magic", "unknown_fingerprint"]
    assert all(r["last_failure_class"] == "poison" and r["dlq"]["topic"] == s.topology.dlq for r in poison)

    text = runner.invoke(main, ["dlq", "list"], env=env)
    assert text.exit_code == 0, text.output
    assert [line.split()[0] for line in text.stdout.splitlines()] == ["release-reservation:x1", "poison", "poison"]

    without = json.loads(runner.invoke(main, ["dlq", "list", "--no-poison", "--json"], env=env).stdout)
    assert [r["op_key"] for r in without["dead_letters"]] == ["release-reservation:x1"]
    tenant = json.loads(runner.invoke(main, ["dlq", "list", "--tenant", "t1", "--json"], env=env).stdout)
    assert [r["poison"] for r in tenant["dead_letters"]] == [False]  # poison has no tenant to match
