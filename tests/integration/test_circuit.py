"""The dead-letter circuit: a partition whose outcomes mostly fail is paused, not drained to the DLQ."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer
from sqlalchemy import func, select

from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.ledger import expiry_event, expiry_record
from lapse.kernel.models import cleanup_ledger
from lapse.processors.circuit import CircuitPolicy, DeadLetterCircuit
from lapse.readers.status import status_report
from tests.fixtures.kafka import committed
from tests.fixtures.pipeline import seed
from tests.fixtures.polling import eventually
from tests.fixtures.topology import repo_topology
from tests.fixtures.workers import process_until_done, running_workers


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_circuit_trips_on_a_failing_window_and_closes_after_cooldown():
    clock = FakeClock()
    circuit = DeadLetterCircuit(CircuitPolicy(threshold=0.5, min_events=10, window=20, cooldown_s=30), clock)
    tp = (repo_topology().expiry, 0)
    assert not circuit.record(tp, good=5, bad=4)       # too few to judge
    assert not circuit.record(tp, good=6, bad=0)       # 4 of 15 failed
    assert circuit.record(tp, good=0, bad=10)          # 14 of 20 failed
    assert circuit.is_open(tp) and circuit.due_to_close() == []
    clock.now = 31
    assert circuit.due_to_close() == [tp] and not circuit.is_open(tp)
    assert circuit.share_failed(tp) == 0.0             # a fresh window after the trip


def test_a_bad_deploy_pauses_the_partition_instead_of_dead_lettering_everything(pipeline):
    settings = pipeline.settings.with_(processor={"batch_size": 10, "circuit_min_events": 10,
                                                  "circuit_threshold": 0.5, "circuit_cooldown_s": 3600})
    now = datetime.now(UTC)
    producer = make_producer(settings)
    for i in range(60):  # every one of these is invalid: the subject is not a reservation id
        bad = expiry_event("release-reservation", f"bad{i}", "t", now - timedelta(minutes=1), source="sweep",
                           correlation_id=f"c{i}")
        producer.produce(settings.topology.expiry, partition=0, key=bad.op_key.encode(),
                         value=pipeline.codec.encode("expiry_event", expiry_record(bad, now)))
    ids = seed(pipeline, 5, tenant="t")  # the good events' tenant
    for rid in ids:
        good = expiry_event("release-reservation", rid, "t", now - timedelta(minutes=1), source="sweep",
                            correlation_id=f"g{rid}")
        producer.produce(settings.topology.expiry, partition=1, key=good.op_key.encode(),
                         value=pipeline.codec.encode("expiry_event", expiry_record(good, now)))
    producer.flush(10)

    stats = process_until_done(settings)

    with pipeline.engine.connect() as conn:
        dead = conn.execute(select(func.count()).where(cleanup_ledger.c.state == "dead_letter")).scalar()
        applied = conn.execute(select(func.count()).where(cleanup_ledger.c.state == "applied")).scalar()
    assert applied == 5                      # the healthy partition kept moving
    assert 10 <= dead < 60                   # the circuit stopped the drain
    topology = settings.topology
    offsets = committed(settings.kafka.bootstrap_servers, topology.groups.cleanup, topology.expiry, 2)
    assert offsets == {0: dead, 1: 5}        # the rest of partition 0 waits in Kafka, uncommitted
    assert stats.dead_lettered == dead
    # The open circuit is the worker's finding, which status (and the console) shows.
    found = status_report(settings, pipeline.engine, datetime.now(UTC), lag=False)["findings"]
    (circuit,) = found["open_circuits"]
    assert circuit["subject"] == f"{topology.expiry}[0]" and circuit["details"]["open"] is True
    assert datetime.fromisoformat(circuit["until"]) > datetime.now(UTC) + timedelta(minutes=50)


def test_a_paused_partition_given_back_by_a_rebalance_is_read_again(pipeline):
    """A partition whose circuit is open, revoked by a member joining and given back when it leaves,
    starts fresh with this worker (as with any new owner): it is read again, not left paused for
    good (librdkafka keeps a partition's pause across a rebalance)."""
    settings = pipeline.settings.with_(processor={"batch_size": 10, "circuit_min_events": 10,
                                                  "circuit_threshold": 0.5, "circuit_cooldown_s": 3600})
    now = datetime.now(UTC)
    producer = make_producer(settings)
    for i in range(60):  # every one invalid: the subject is not a reservation id
        bad = expiry_event("release-reservation", f"bad{i}", "t", now - timedelta(minutes=1), source="sweep")
        producer.produce(settings.topology.expiry, partition=0, key=bad.op_key.encode(),
                         value=pipeline.codec.encode("expiry_event", expiry_record(bad, now)))
    producer.flush(10)

    def dead() -> int:
        with pipeline.engine.connect() as conn:
            return conn.execute(select(func.count()).where(cleanup_ledger.c.state == "dead_letter")).scalar()

    with running_workers(settings) as running:
        (worker,) = running.workers
        eventually(lambda: (running.check(), worker.circuit.is_open((settings.topology.expiry, 0)))[1],
                   timeout_s=60, what="the circuit open")
        before = dead()
        other = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.auto.commit": False,
                          "group.id": settings.topology.groups.cleanup, "auto.offset.reset": "latest"})
        other.subscribe([settings.topology.expiry])
        eventually(lambda: (other.poll(0.2), other.assignment())[1], timeout_s=30, what="a second member assigned")
        other.close()
        eventually(lambda: (running.check(), dead() > before)[1], timeout_s=60, interval_s=0.5,
                   what="partition 0 read again after the rebalance")
