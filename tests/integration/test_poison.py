"""Poison input on Apache Kafka: each bad record is dead-lettered with its reason and the partition
keeps moving (undecodable bytes are covered in test_pipeline.py); an event of a kind the kinds file
does not declare is no poison: its work waits, held."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer
from sqlalchemy import select

from lapse.devtools.demo_data import add_reservations
from lapse.kernel.ledger import expiry_event, expiry_record
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.models import ledger_transitions as T
from tests.fixtures.kafka import committed, read_topic
from tests.fixtures.workers import process_until_done

NOW = datetime.now(UTC)


def record(codec, kind, subject, tenant="t1", **tampered) -> bytes:
    """An expiry event as the factory makes it, with `tampered` fields overwritten on the wire."""
    event = expiry_event(kind, subject, tenant, NOW - timedelta(minutes=5), source="sweep", correlation_id="c")
    return codec.encode("expiry_event", {**expiry_record(event, NOW), **tampered})


def test_unknown_fingerprint_wrong_schema_bad_key_and_oversized_field_go_to_dlq_an_undeclared_kind_waits(pipeline):
    s, codec = pipeline.settings, pipeline.codec
    with pipeline.engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, tenant="t1", expires_at=NOW - timedelta(minutes=10))
    good = record(codec, "release-reservation", rid)
    outcome = {"outcome_id": 1, "op_key": "x:1", "kind": "x", "tenant": "t", "subject_id": "1",
               "status": "applied", "attempt": 1, "failure_class": None, "reason": None, "due_at": 0,
               "occurred_at": 0, "correlation_id": "c", "replay_id": None, "worker": None}
    bad = [
        b"\xc3\x01" + bytes(8) + good[10:],                                  # unknown fingerprint
        codec.encode("cleanup_outcome", outcome),                            # not an expiry event
        record(codec, "release-reservation", 8, op_key="release-reservation:7"),  # key ≠ subject
        record(codec, "no-such-kind", 1),                                    # unknown kind
        record(codec, "release-reservation", 9, tenant="t" * 65),            # no ledger row fits
    ]
    producer = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
    for value in [*bad, good]:
        producer.produce(s.topology.expiry, key=b"k", value=value, partition=0)
    assert producer.flush(10) == 0

    stats = process_until_done(s)
    assert (stats.poison, stats.applied) == (4, 1)
    letters = [codec.decode_expected("dead_letter", m.value())
               for m in read_topic(s.kafka.bootstrap_servers, s.topology.dlq)]
    assert [lt["reason"].split(":")[0] for lt in letters] == [
        "unknown_fingerprint", "unexpected_schema", "malformed_op_key", "invalid_field"]
    assert all(lt["failure_class"] == "poison" and lt["source_partition"] == 0 for lt in letters)
    assert [lt["source_offset"] for lt in letters] == [0, 1, 2, 4]
    with pipeline.engine.connect() as conn:
        state, attempt = conn.execute(select(L.c.state, L.c.attempt).where(L.c.op_key == "no-such-kind:1")).one()
        reason = conn.execute(select(T.c.reason).where(T.c.op_key == "no-such-kind:1", T.c.to_state == "held")
                              ).scalar_one()
    assert (state, attempt) == ("held", 0)
    assert reason.startswith("undeclared: kind 'no-such-kind'")
    assert committed(s.kafka.bootstrap_servers, s.topology.groups.cleanup, s.topology.expiry, 1)[0] == 6
