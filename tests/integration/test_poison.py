"""Poison input on Apache Kafka: each bad record is dead-lettered with its reason and the partition
keeps moving (undecodable bytes are covered in test_pipeline.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer

from lapse.devtools.demo_data import add_reservations
from lapse.kernel.ledger import ExpiryEvent
from lapse.processors.worker import CleanupWorker
from tests.pipeline_env import committed, read_topic

NOW = datetime.now(UTC)


def record(codec, op_key, kind, subject, tenant="t1") -> bytes:
    event = ExpiryEvent(op_key=op_key, kind=kind, tenant=tenant, subject_id=subject,
                        due_at=NOW - timedelta(minutes=5), correlation_id="c")
    return codec.encode("expiry_event", event.to_record(NOW))


def test_unknown_fingerprint_wrong_schema_bad_key_unknown_kind_and_oversized_field_go_to_dlq(pipeline):
    s, codec = pipeline.settings, pipeline.codec
    with pipeline.engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, expires_at=NOW - timedelta(minutes=10))
    good = record(codec, f"release-reservation:{rid}", "release-reservation", str(rid))
    outcome = {"outcome_id": 1, "op_key": "x:1", "kind": "x", "tenant": "t", "subject_id": "1",
               "status": "applied", "attempt": 1, "failure_class": None, "reason": None, "due_at": 0,
               "occurred_at": 0, "correlation_id": "c", "replay_id": None, "worker": None}
    bad = [
        b"\xc3\x01" + bytes(8) + good[10:],                                  # unknown fingerprint
        codec.encode("cleanup_outcome", outcome),                            # not an expiry event
        record(codec, "release-reservation:7", "release-reservation", "8"),  # key ≠ subject
        record(codec, "no-such-kind:1", "no-such-kind", "1"),                # unknown kind
        record(codec, "release-reservation:9", "release-reservation", "9",  # no ledger row fits
               tenant="t" * 65),
    ]
    producer = Producer({"bootstrap.servers": s.bootstrap_servers})
    for value in [*bad, good]:
        producer.produce(s.expiry_topic, key=b"k", value=value, partition=0)
    assert producer.flush(10) == 0

    stats = CleanupWorker(s).run(exit_when_idle=2.0)
    assert (stats.poison, stats.applied) == (5, 1)
    letters = [codec.decode_expected("dead_letter", m.value()) for m in read_topic(s.bootstrap_servers, s.dlq_topic)]
    assert [lt["reason"].split(":")[0] for lt in letters] == [
        "unknown_fingerprint", "unexpected_schema", "malformed_op_key", "unknown_kind",
        "invalid_field"]
    assert all(lt["failure_class"] == "poison" and lt["source_partition"] == 0 for lt in letters)
    assert [lt["source_offset"] for lt in letters] == [0, 1, 2, 3, 4]
    assert committed(s.bootstrap_servers, s.cleanup_group, s.expiry_topic, 1)[0] == 6
