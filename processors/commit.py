"""The commit order of one batch, in one place.

Offsets move only after everything the batch caused is durable: the database transaction, then
any record produced for the batch. A crash anywhere before step 3 means redelivery, which the
ledger turns into absorbed duplicates.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from lapse.kernel.codec import Codec
from lapse.kernel.delays import delay_record
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.ledger_queries import millis
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.processors.decode import Poison
from lapse.processors.leased import EffectRunner, effect_runner, run_leased
from lapse.processors.rules import BatchResult, Topics, apply_batch, dead_letter_events

DEADLOCK_RETRIES = 3
log = get_logger("processor")


@dataclass
class BatchContext:
    """What a batch needs besides its records; built once per worker."""

    settings: Settings
    engine: Engine
    codec: Codec
    kinds: dict[str, CleanupKind]
    producer: Producer
    delivery: DeliveryTracker
    tiers: list[tuple[str, int]]
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    effects: EffectRunner | None = None  # built from settings on first use
    rng: random.Random = field(default_factory=random.Random)  # retry jitter

    @property
    def topics(self) -> Topics:
        return Topics(outcomes=self.settings.outcomes_topic, dlq=self.settings.dlq_topic,
                      expiry=self.settings.expiry_topic,
                      delay_prefix=self.settings.delay_topic_prefix, tiers=tuple(self.tiers))


def commit_batch(
    ctx: BatchContext,
    consumer: Consumer,
    owned: set[tuple[str, int]],
    messages: list,
    events: list[ExpiryEvent],
    positions: dict,
    poison: list[Poison],
) -> BatchResult:
    """Make one batch durable, then move its offsets.

    1. DB commit: one transaction claims the ledger rows, runs the in-database effects, and writes
       transitions and outbox rows (outcomes, ledger-backed dead letters, and the wake-up records
       of scheduled retries); retried on deadlock. Kinds with an external effect are only claimed
       under a lease here; their effects then run outside any transaction and a second
       transaction records them applied or schedules their retry / dead letter
       (`lapse.processors.leased`). A crash between the two leaves the row claimed: the redelivered
       record backs off until the lease ends, then redoes the idempotent effect and completes.
       Retry wake-ups go through the outbox, not step 2, so the retry schedule and its wake-up
       commit together: a crash after the commit cannot lose the wake-up (the relay sends it at
       least once; the reconciler still re-emits retry rows past due as a backstop).
    2. Produce what has no ledger change: poison records to `lapse.dlq`, early events back to a
       delay tier at the ledger's due time, events held under another worker's lease back to a
       tier until that lease ends; then flush, and raise if any record was not acknowledged
       (offsets stay put).
    3. Store and commit, synchronously, the next offset (last + 1) of every partition in the batch
       that this consumer still owns; a revoked partition's offsets are never committed.
    """
    now = ctx.clock()
    result = BatchResult()
    if events:
        result = _apply_with_retry(ctx, events, positions, now)
        if result.leased:
            _run_leased(ctx, result, positions)
    _crash_if("after_db_commit", ctx.settings)

    for item in poison:
        _produce_poison(ctx, item, now)
    for event in result.not_due + result.backed_off:
        _produce_delayed(ctx, event, now)
    if poison or result.not_due or result.backed_off:
        ctx.delivery.flush(ctx.producer)
    _crash_if("after_produce", ctx.settings)

    commit_offsets(consumer, owned, messages)
    return result


def _apply_with_retry(ctx: BatchContext, events, positions, now) -> BatchResult:
    """The batch transaction, retried on deadlock. Any other failure that is not about the
    connection is taken as one event's fault: the batch is redone event by event (see
    `isolate_failures`), so one bad event cannot fail its batch, and the worker, forever."""
    lease = timedelta(seconds=ctx.settings.lease_seconds)
    for attempt in range(DEADLOCK_RETRIES):
        try:
            with ctx.engine.begin() as conn:
                return apply_batch(
                    conn, events, kinds=ctx.kinds, topics=ctx.topics,
                    worker=ctx.settings.worker_id, now=now, lease=lease, positions=positions,
                    rng=ctx.rng,
                )
        except (OperationalError, InterfaceError) as exc:
            if "deadlock" not in str(exc).lower() or attempt == DEADLOCK_RETRIES - 1:
                raise
        except Exception as exc:
            log.warning("batch transaction failed, isolating the event at fault",
                        extra={"records": len(events), "error": _one_line(exc)})
            return isolate_failures(ctx.engine, events, kinds=ctx.kinds, topics=ctx.topics,
                                    worker=ctx.settings.worker_id, now=now, lease=lease,
                                    positions=positions, rng=ctx.rng)
    raise AssertionError("unreachable")


def isolate_failures(engine, events: list[ExpiryEvent], *, kinds, topics, worker: str,
                     now: datetime, lease: timedelta, positions: dict | None = None,
                     rng: random.Random | None = None) -> BatchResult:
    """Apply each event in its own transaction; an event whose transaction fails (other than by
    the connection) is dead-lettered as invalid with the error's first line."""
    result = BatchResult()
    failed: list[tuple[ExpiryEvent, str]] = []
    for event in events:
        try:
            with engine.begin() as conn:
                result.absorb(apply_batch(conn, [event], kinds=kinds, topics=topics, worker=worker,
                                          now=now, lease=lease, positions=positions, rng=rng))
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            failed.append((event, _one_line(exc)))
            log.warning("event dead-lettered: its cleanup fails in the database",
                        extra={"op_key": event.op_key, "correlation_id": event.correlation_id,
                               "error": _one_line(exc)})
    if failed:
        with engine.begin() as conn:
            result.absorb(dead_letter_events(conn, failed, kinds=kinds, topics=topics, worker=worker,
                                             now=now, lease=lease, positions=positions, rng=rng))
    return result


def _one_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first}"[:500]


def _run_leased(ctx: BatchContext, result: BatchResult, positions) -> None:
    """Run the leased external effects and record them (the second transaction)."""
    if ctx.effects is None:
        ctx.effects = effect_runner(ctx.settings)
    done = run_leased(ctx.engine, ctx.effects, result.leased, result.targets, kinds=ctx.kinds,
                      topics=ctx.topics, worker=ctx.settings.worker_id, clock=ctx.clock,
                      lease=timedelta(seconds=ctx.settings.lease_seconds), rng=ctx.rng,
                      positions=positions)
    result.applied += done.applied
    result.retried += done.retried
    result.dead_lettered += done.dead_lettered


def commit_offsets(consumer: Consumer, owned: set[tuple[str, int]], messages: list) -> list[TopicPartition]:
    """Store and commit last+1 per owned partition seen in `messages`; returns what was committed."""
    nxt: dict[tuple[str, int], int] = {}
    for msg in messages:
        tp = (msg.topic(), msg.partition())
        nxt[tp] = max(nxt.get(tp, -1), msg.offset() + 1)
    offsets = [TopicPartition(t, p, o) for (t, p), o in nxt.items() if (t, p) in owned]
    if offsets:
        consumer.store_offsets(offsets=offsets)
        consumer.commit(offsets=offsets, asynchronous=False)
    return offsets


def _produce_poison(ctx: BatchContext, item: Poison, now: datetime) -> None:
    record = {
        "op_key": None, "kind": None, "tenant": None, "subject_id": None,
        "failure_class": "poison", "reason": f"{item.reason_code}: {item.reason}"[:2000],
        "attempt": 0, "history": [],
        "source_topic": item.topic, "source_partition": item.partition, "source_offset": item.offset,
        "original_key": item.key, "original_value": item.value,
        "original_headers": {k: (v or b"") for k, v in item.headers},
        "dead_lettered_at": millis(now), "correlation_id": None, "replay_id": None,
    }
    ctx.producer.produce(
        ctx.settings.dlq_topic, key=item.key, value=ctx.codec.encode("dead_letter", record),
        headers=[("failure_class", b"poison"), ("reason", item.reason_code.encode())],
        on_delivery=ctx.delivery,
    )


def _produce_delayed(ctx: BatchContext, event: ExpiryEvent, now: datetime) -> None:
    topic, headers = delay_record(ctx.tiers, ctx.settings.delay_topic_prefix, event.due_at, now,
                                  ctx.settings.expiry_topic)
    ctx.producer.produce(topic, key=event.op_key.encode(),
                         value=ctx.codec.encode("expiry_event", event.to_record(now)),
                         headers=headers, on_delivery=ctx.delivery)


def _crash_if(point: str, settings: Settings) -> None:
    """Test hook: die without cleanup at a named point, as a killed process would."""
    if settings.crash_point == point:
        os._exit(17)
