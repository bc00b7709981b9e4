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

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from lapse.kernel.codec import Codec
from lapse.kernel.delays import delay_record
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent, Original, Position, dead_letter_record, expiry_record
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.kernel.topology import Topology
from lapse.processors.decode import Poison, position_of
from lapse.processors.leased import EffectRunner, effect_runner, run_leased
from lapse.processors.rules import apply_batch, dead_letter_events
from lapse.processors.scope import BatchResult, BatchScope

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
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    effects: EffectRunner | None = None  # built from settings on first use
    rng: random.Random = field(default_factory=random.Random)  # retry jitter

    @property
    def topics(self) -> Topology:
        return self.settings.topology

    def scope(self, conn: Connection, now: datetime, positions: dict[str, Position]) -> BatchScope:
        """The scope of one batch on `conn`: the worker's settings are read here, once."""
        return BatchScope(conn, kinds=self.kinds, topics=self.topics, worker=self.settings.runtime.worker_id,
                          now=now, lease=timedelta(seconds=self.settings.processor.lease_seconds),
                          positions=positions, rng=self.rng)

    def effect_runner(self) -> EffectRunner:
        """The runner of external effects, built from settings on first use."""
        if self.effects is None:
            self.effects = effect_runner(self.settings)
        return self.effects


def commit_batch(
    ctx: BatchContext,
    consumer: Consumer,
    owned: set[tuple[str, int]],
    messages: list[Message],
    events: list[ExpiryEvent],
    positions: dict[str, Position],
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
        with ctx.engine.connect() as conn:
            scope = ctx.scope(conn, now, positions)
            result = _apply_with_retry(scope, events)
            if result.leased:
                result.absorb(run_leased(ctx.effect_runner(), scope, result, ctx.clock))
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


def _apply_with_retry(scope: BatchScope, events: list[ExpiryEvent]) -> BatchResult:
    """The batch transaction, retried on deadlock. Any other failure that is not about the
    connection is taken as one event's fault: the batch is redone event by event (see
    `isolate_failures`), so one bad event cannot fail its batch, and the worker, forever."""
    for attempt in range(DEADLOCK_RETRIES):
        try:
            with scope.conn.begin():
                return apply_batch(scope.fresh(), events)
        except (OperationalError, InterfaceError) as exc:
            if "deadlock" not in str(exc).lower() or attempt == DEADLOCK_RETRIES - 1:
                raise
        except Exception as exc:
            log.warning("batch transaction failed, isolating the event at fault",
                        extra={"records": len(events), "error": _one_line(exc)})
            return isolate_failures(scope, events)
    raise AssertionError("unreachable")


def isolate_failures(scope: BatchScope, events: list[ExpiryEvent]) -> BatchResult:
    """Apply each event in its own transaction on the scope's connection; an event whose
    transaction fails (other than by the connection) is dead-lettered as invalid with the
    error's first line."""
    result = BatchResult()
    failed: list[tuple[ExpiryEvent, str]] = []
    for event in events:
        try:
            with scope.conn.begin():
                result.absorb(apply_batch(scope.fresh(), [event]))
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            failed.append((event, _one_line(exc)))
            log.warning("event dead-lettered: its cleanup fails in the database",
                        extra={"op_key": event.op_key, "correlation_id": event.correlation_id,
                               "error": _one_line(exc)})
    if failed:
        with scope.conn.begin():
            result.absorb(dead_letter_events(scope.fresh(), failed))
    return result


def _one_line(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first}"[:500]


def commit_offsets(consumer: Consumer, owned: set[tuple[str, int]], messages: list[Message]
                   ) -> list[TopicPartition]:
    """Store and commit last+1 per owned partition seen in `messages`; returns what was committed."""
    nxt: dict[tuple[str, int], int] = {}
    for msg in messages:
        topic, partition, offset = position_of(msg)
        nxt[(topic, partition)] = max(nxt.get((topic, partition), -1), offset + 1)
    offsets = [TopicPartition(t, p, o) for (t, p), o in nxt.items() if (t, p) in owned]
    if offsets:
        consumer.store_offsets(offsets=offsets)
        consumer.commit(offsets=offsets, asynchronous=False)
    return offsets


def _produce_poison(ctx: BatchContext, item: Poison, now: datetime) -> None:
    record = dead_letter_record(
        "poison", f"{item.reason_code}: {item.reason}"[:2000], 0, now,
        position=(item.topic, item.partition, item.offset),
        original=Original(item.key, item.value, {k: (v or b"") for k, v in item.headers}))
    ctx.producer.produce(
        ctx.topics.dlq, key=item.key, value=ctx.codec.encode("dead_letter", record),
        headers=[("failure_class", b"poison"), ("reason", item.reason_code.encode())],
        on_delivery=ctx.delivery,
    )


def _produce_delayed(ctx: BatchContext, event: ExpiryEvent, now: datetime) -> None:
    topic, headers = delay_record(ctx.topics, event.due_at, now)
    ctx.producer.produce(topic, key=event.op_key.encode(),
                         value=ctx.codec.encode("expiry_event", expiry_record(event, now)),
                         headers=list(headers), on_delivery=ctx.delivery)


def _crash_if(point: str, settings: Settings) -> None:
    """Test hook: die without cleanup at a named point, as a killed process would."""
    if settings.dev.crash_point == point:
        os._exit(17)
