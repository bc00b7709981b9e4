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
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, InterfaceError, OperationalError

from lapse.kernel.codec import Codec
from lapse.kernel.delays import delay_record
from lapse.kernel.kafka_clients import DeliveryFailed, DeliveryTracker, message_max_bytes, produce_or_refusal
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent, OriginalBudget, Position, expiry_record
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.kernel.topology import Topology
from lapse.processors.dead_letters import send_poison
from lapse.processors.decode import Poison, poison_of, position_of
from lapse.processors.leased import EffectRunner, effect_runner, run_leased
from lapse.processors.rules import Invalid, apply_batch, dead_letter_events
from lapse.processors.scope import BatchResult, BatchScope

DEADLOCK_RETRIES = 3
log = get_logger("processor")


@dataclass
class WorkerContext:
    """What every batch of one worker needs besides its records: built once per worker."""

    settings: Settings
    engine: Engine
    codec: Codec
    kinds: dict[str, CleanupKind]
    producer: Producer
    delivery: DeliveryTracker
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    effects: EffectRunner | None = None  # built from settings on first use
    rng: random.Random = field(default_factory=random.Random)  # retry jitter
    commit_asynchronously: bool = False  # step 3 of commit_batch; the worker's loop sets it
    # Where step 3 calls the consumer: inline, or handed to the consumer's own thread by a worker
    # that runs batches on a batch thread (`lapse.processors.in_flight`).
    on_consumer_thread: Callable[[Callable[[], Any]], Any] = lambda call: call()

    @property
    def topics(self) -> Topology:
        return self.settings.topology

    def scope(self, conn: Connection, now: datetime, positions: dict[str, Position]) -> BatchScope:
        """The scope of one batch on `conn`: the worker's settings are read here, once."""
        return BatchScope(conn, kinds=self.kinds, topics=self.topics, worker=self.settings.runtime.worker_id,
                          now=now, lease=timedelta(seconds=self.settings.processor.lease_seconds),
                          positions=positions, rng=self.rng)

    @property
    def budget(self) -> OriginalBudget:
        """How much of a poison record its dead letter keeps: under the producer's size limit."""
        return OriginalBudget.under(message_max_bytes(self.settings))

    def effect_runner(self) -> EffectRunner:
        """The runner of external effects, built from settings on first use."""
        if self.effects is None:
            self.effects = effect_runner(self.settings)
        return self.effects


def commit_batch(
    ctx: WorkerContext,
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
       of scheduled retries); due work whose outcome can only be `applied` (no row yet, or a
       due unclaimed `pending` one) has its row written once, already applied, before its effect
       (`lapse.processors.fast_path`); retried on deadlock. If it fails for another
       reason, the batch is redone event by event, and an event whose own transaction fails is
       dead-lettered through the ledger in a transaction of its own; an event whose values the
       ledger refuses even then joins step 2's poison as its raw record (`isolate_failures`). Kinds
       with an external effect are only claimed under a lease here; their effects then run outside
       any transaction and a second transaction records them applied or schedules their retry /
       dead letter (`lapse.processors.leased`). A crash between the two leaves the row claimed:
       the redelivered record backs off until the lease ends, then redoes the idempotent effect
       and completes. Retry wake-ups go through the outbox, not step 2, so the retry schedule and
       its wake-up commit together: a crash after the commit cannot lose the wake-up (the relay
       sends it at least once; the reconciler still re-emits retry rows past due as a backstop).
    2. Produce what has no ledger change, and flush: first poison to `lapse.dlq` (the original
       bytes clipped to a budget under the producer's size limit; a dead letter the DLQ refuses
       for its size or form goes again without them), each logged as dead-lettered only once
       acknowledged; then early events back to a delay tier at the ledger's due time, and events
       held under another worker's lease back to a tier until that lease ends. Raise if any
       record was not acknowledged (offsets stay put).
    3. Commit, on the consumer's own thread, the next offset (last + 1) of every partition in
       the batch that this consumer still owns; a revoked partition's offsets are never
       committed. With `commit_asynchronously` the commit is sent without waiting for the
       broker's answer: the effects are already durable, so a commit lost in a crash only means
       redelivery, which the ledger absorbs; the worker commits synchronously when a partition is
       revoked and on close.
    """
    now = ctx.clock()
    result = BatchResult()
    unrecorded: list[Invalid] = []
    if events:
        with ctx.engine.connect() as conn:
            scope = ctx.scope(conn, now, positions)
            result = _apply_with_retry(scope, events, unrecorded)
            if result.leased:
                result.absorb(run_leased(ctx.effect_runner(), scope, result, ctx.clock))
    _crash_if("after_db_commit", ctx.settings)

    poison = [*poison, *raw_records(messages, positions, unrecorded)]
    send_poison(ctx.producer, ctx.codec, ctx.delivery, ctx.topics.dlq, poison, now, ctx.budget)
    for event in result.not_due + result.backed_off:
        _produce_delayed(ctx, event, now)
    if result.not_due or result.backed_off:
        ctx.delivery.flush(ctx.producer)
    _crash_if("after_produce", ctx.settings)

    ctx.on_consumer_thread(lambda: commit_offsets(consumer, owned, messages,
                                                  asynchronous=ctx.commit_asynchronously))
    return result


def _apply_with_retry(scope: BatchScope, events: list[ExpiryEvent], unrecorded: list[Invalid]) -> BatchResult:
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
            return isolate_failures(scope, events, unrecorded)
    raise AssertionError("unreachable")


def isolate_failures(scope: BatchScope, events: list[ExpiryEvent],
                     unrecorded: list[Invalid] | None = None) -> BatchResult:
    """Apply each event in its own transaction on the scope's connection; an event whose
    transaction fails (other than by the connection) is dead-lettered as invalid with the
    error's first line, in a transaction of its own, and logged once that has committed.

    The last resort: an event whose dead letter fails too, because the database refuses its values
    (`values_at_fault`), is appended to `unrecorded` with both reasons, for the caller to send its
    raw record to the DLQ as poison. Without `unrecorded` (or for any other failure) the error
    is raised."""
    result = BatchResult()
    failed: list[Invalid] = []
    for event in events:
        try:
            with scope.conn.begin():
                result.absorb(apply_batch(scope.fresh(), [event]))
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            failed.append((event, _one_line(exc)))
    for event, reason in failed:
        ids = {"op_key": event.op_key, "correlation_id": event.correlation_id}
        try:
            with scope.conn.begin():
                lettered = dead_letter_events(scope.fresh(), [(event, reason)])
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            if unrecorded is None or not values_at_fault(exc):
                raise
            unrecorded.append((event, f"{reason}; its dead letter failed too: {_one_line(exc)}"))
            log.error("the ledger refused the dead letter of an event: its record goes to the DLQ as "
                      "poison", extra={**ids, "error": _one_line(exc)})
            continue
        result.absorb(lettered)
        if event.op_key in lettered.dead_lettered:  # else its row was already terminal: a duplicate
            log.warning("event dead-lettered: its cleanup fails in the database", extra={**ids, "error": reason})
    return result


def values_at_fault(exc: BaseException) -> bool:
    """Whether a failed statement failed for the values it carried: the database refused them (a
    data exception or integrity violation, SQLSTATE classes 22 and 23), a value could not even be
    bound, or the rows could not be built in Python. A failure of the database itself (a missing
    column, a permission, a read-only server) is no event's fault: it is raised, not dead-lettered."""
    if isinstance(exc, (DataError, IntegrityError)):
        return True
    return not isinstance(exc, DBAPIError)  # a StatementError of its own is a value not bound


def raw_records(messages: list[Message], positions: dict[str, Position], unrecorded: list[Invalid]
                ) -> list[Poison]:
    """The consumed records of events the ledger could not take, as poison with the reason."""
    by_position = {position_of(msg): msg for msg in messages}
    return [poison_of(by_position[positions[event.op_key]], "ledger_refused",
                      f"{event.op_key}: the ledger refused the event and its dead letter: {reason}")
            for event, reason in unrecorded if positions.get(event.op_key) in by_position]


def _one_line(exc: BaseException) -> str:
    """The error's type and first line, control characters escaped (it may quote a value)."""
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return one_line(f"{type(cause).__name__}: {first}", 500, escape=True)


def commit_offsets(consumer: Consumer, owned: set[tuple[str, int]], messages: list[Message], *,
                   asynchronous: bool = False) -> list[TopicPartition]:
    """Commit last+1 per owned partition seen in `messages` (waiting for the broker unless
    `asynchronous`); returns what was committed. The offsets are passed explicitly, never stored in
    the consumer first: storing takes locks the consumer's thread holds during a rebalance
    callback, where the worker waits for this batch."""
    nxt: dict[tuple[str, int], int] = {}
    for msg in messages:
        topic, partition, offset = position_of(msg)
        nxt[(topic, partition)] = max(nxt.get((topic, partition), -1), offset + 1)
    offsets = [TopicPartition(t, p, o) for (t, p), o in nxt.items() if (t, p) in owned]
    if offsets:
        if asynchronous:
            consumer.commit(offsets=offsets, asynchronous=True)
        else:
            consumer.commit(offsets=offsets, asynchronous=False)
    return offsets


def _produce_delayed(ctx: WorkerContext, event: ExpiryEvent, now: datetime) -> None:
    """Queue `event`'s wake-up on its delay tier (a full queue is waited out). A validated event
    is a few KiB, so a refusal for its size is a bug: raised as permanent, never dropped."""
    topic, headers = delay_record(ctx.topics, event.due_at, now)
    refused = produce_or_refusal(ctx.producer, topic, key=event.op_key.encode(),
                                 value=ctx.codec.encode("expiry_event", expiry_record(event, now)),
                                 headers=list(headers), on_delivery=ctx.delivery)
    if refused is not None:
        raise DeliveryFailed(f"{topic} refused the wake-up of {event.op_key}: {refused.str()}", permanent=True)


def _crash_if(point: str, settings: Settings) -> None:
    """Test hook: die without cleanup at a named point, as a killed process would."""
    if settings.dev.crash_point == point:
        os._exit(17)
