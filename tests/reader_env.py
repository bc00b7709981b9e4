"""Shared set-up of the reader tests (audit, status, offsets): fresh topics and settings, and a
small in-process pipeline run (sweep, one CleanupWorker, relay) that builds a real history."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from sqlalchemy import func, select

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import DeliveryTracker, make_producer
from lapse.kernel.kinds import registry
from lapse.kernel.ledger import TERMINAL
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.settings import Settings, load_settings
from lapse.producers.relay import relay_until_empty
from lapse.producers.sweep import sweep_once
from tests.fixtures_kafka import create_topics


def reader_settings(bootstrap: str, db_url: str, unique, **extra) -> Settings:
    """Settings on fresh expiry/outcomes/dlq topics (3/3/1 partitions) and a fresh cleanup group."""
    prefix = unique("lapse") + "."
    settings = load_settings(
        bootstrap_servers=bootstrap, database_url=db_url, expiry_topic=prefix + "expiry",
        outcomes_topic=prefix + "outcomes", dlq_topic=prefix + "dlq",
        delay_topic_prefix=prefix + "delay.", cleanup_group=unique("cleanup"),
        session_timeout_ms=6000, poll_timeout_s=0.1, log_format="text", **extra)
    create_topics(bootstrap, {settings.expiry_topic: 3, settings.outcomes_topic: 3, settings.dlq_topic: 1})
    return settings


def sweep(settings: Settings) -> None:
    engine = make_engine(settings.database_url_plain())
    producer = make_producer(settings)
    sweep_once(engine, producer, Codec.from_settings(settings), settings, registry())
    engine.dispose()


def produce_events(settings: Settings, events: list, topic: str | None = None) -> None:
    """Produce ExpiryEvents as the sweep would (keyed by op key), e.g. duplicates or bad ones."""
    from lapse.producers.emit import emit_events

    emit_events(make_producer(settings), Codec.from_settings(settings), DeliveryTracker(),
                topic or settings.expiry_topic, events, datetime.now(UTC))


def process_until_terminal(settings: Settings, expected: int, timeout_s: float = 60.0,
                           replayed: int = 0) -> None:
    """Run one CleanupWorker until `expected` ledger rows are terminal, `replayed` of them after a
    replay (a bounded wait), then stop."""
    from lapse.processors.worker import CleanupWorker

    engine = make_engine(settings.database_url_plain())
    worker = CleanupWorker(settings)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                done = conn.execute(select(func.count()).select_from(cleanup_ledger)
                                    .where(cleanup_ledger.c.state.in_(TERMINAL))).scalar()
                again = conn.execute(select(func.count()).select_from(cleanup_ledger).where(
                    cleanup_ledger.c.state.in_(TERMINAL), cleanup_ledger.c.replay_id.is_not(None))).scalar()
            if done >= expected and again >= replayed:
                break
            time.sleep(0.2)
    finally:
        worker.stop.set()
        thread.join(30)
        engine.dispose()
    assert done >= expected, f"only {done} of {expected} ledger rows terminal"


def relay(settings: Settings) -> int:
    engine = make_engine(settings.database_url_plain())
    try:
        return relay_until_empty(engine, make_producer(settings), Codec.from_settings(settings),
                                 settings.relay_batch_size)
    finally:
        engine.dispose()


def outcome_record(outcome_id: int, subject: str, status: str = "applied", **extra) -> dict:
    """A cleanup_outcome record as the relay publishes it."""
    now = datetime.now(UTC)
    return {"outcome_id": outcome_id, "op_key": f"release-reservation:{subject}",
            "kind": "release-reservation", "tenant": "t1", "subject_id": subject, "status": status,
            "attempt": 1, "failure_class": None, "reason": None, "due_at": now, "occurred_at": now,
            "correlation_id": f"c-{subject}", "replay_id": None, "worker": "test", **extra}


def produce_outcomes(settings: Settings, records: list[dict]) -> None:
    codec = Codec.from_settings(settings)
    producer = make_producer(settings)
    for record in records:
        producer.produce(settings.outcomes_topic, key=record["op_key"].encode(),
                         value=codec.encode("cleanup_outcome", record))
    assert producer.flush(10) == 0
