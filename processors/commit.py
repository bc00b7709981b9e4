"""The commit order of one batch, in one place: the database, then produced records, then offsets.

Why this order, and what a crash at each point means: docs/design/processing.md, "The commit order".
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
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

from lapse.kernel.clock import Clock
from lapse.kernel.codec import Codec
from lapse.kernel.delays import delay_record
from lapse.kernel.kafka_clients import DeliveryFailed, DeliveryTracker, message_max_bytes, produce_or_refusal
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent, OriginalBudget, Position, expiry_record
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import is_conflict, is_transient
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.kernel.topology import Topology
from lapse.kernel.trace_context import carried
from lapse.kernel.tracing import PROCESS, stage
from lapse.processors.dead_letters import send_poison
from lapse.processors.decode import Poison, poison_of, position_of
from lapse.processors.leased import EffectRunner, effect_runner, run_leased
from lapse.processors.offset_commits import PendingCommits
from lapse.processors.rules import Invalid, apply_batch, dead_letter_events
from lapse.processors.scope import BatchResult, BatchScope

DEADLOCK_RETRIES = 3
# The poison codes of consumed records that get no ledger row after all: the ledger refused even
# their dead letter; their tenant is not their business row's (forged or mistaken).
LEDGER_REFUSED, TENANT_MISMATCH = "ledger_refused", "tenant_mismatch"
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
    clock: Clock | None = None  # a settable now (tests); None: the database's, per transaction
    effects: EffectRunner | None = None  # built from settings on first use
    rng: random.Random = field(default_factory=random.Random)  # retry jitter
    commit_asynchronously: bool = False  # step 3 of commit_batch; the worker's loop sets it
    pending_commits: PendingCommits | None = None  # offsets sent without waiting, until accepted
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
                          positions=positions, rng=self.rng, clock=self.clock)

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

    1. DB commit: the batch's transaction (`apply_batch`), retried on deadlock, redone event by
       event when one event fails it; then the leased external effects and their own transaction
       (one span of each sampled trace among the events, when spans are recorded).
    2. Produce what has no ledger change (poison to the DLQ, events of a forged tenant among it;
       early and backed-off events to a delay tier) and flush; raise if any record was not
       acknowledged.
    3. Commit the next offset of every partition still owned, on the consumer's thread.
    """
    # The poison's dead-letter time when the batch has no transaction; else the transaction's now.
    now = ctx.clock() if ctx.clock is not None else datetime.now(UTC)
    result = BatchResult()
    unrecorded: list[Invalid] = []
    # Step 1: the database commit (and the external effects' second transaction).
    if events:
        traced = ((e.traceparent, e.op_key) for e in events)  # read only when spans are recorded
        with ctx.engine.connect() as conn, stage(PROCESS, traced, {"lapse.batch.events": len(events)}):
            scope = ctx.scope(conn, now, positions)
            result, now = _apply_with_retry(scope, events, unrecorded)
            if result.leased:
                result.absorb(run_leased(ctx.effect_runner(), scope, result, ctx.clock))
    _crash_if("after_db_commit", ctx.settings)

    # Step 2: produce what has no ledger change, and flush.
    refused = [(e, f"the ledger refused the event and its dead letter: {r}") for e, r in unrecorded]
    poison = [*poison, *raw_records(messages, positions, refused, LEDGER_REFUSED),
              *raw_records(messages, positions, result.forged, TENANT_MISMATCH)]
    send_poison(ctx.producer, ctx.codec, ctx.delivery, ctx.topics.dlq, poison, now, ctx.budget)
    for event in result.not_due + result.backed_off:
        _produce_delayed(ctx, event, now)
    if result.not_due or result.backed_off:
        ctx.delivery.flush(ctx.producer)
    _crash_if("after_produce", ctx.settings)

    # Step 3: commit the offsets, on the consumer's thread.
    ctx.on_consumer_thread(lambda: commit_offsets(consumer, owned, messages, asynchronous=ctx.commit_asynchronously,
                                                  pending=ctx.pending_commits))
    return result


def _apply_with_retry(scope: BatchScope, events: list[ExpiryEvent], unrecorded: list[Invalid]
                      ) -> tuple[BatchResult, datetime]:
    """The batch transaction at its own now (returned with the result: the delay records' tiers
    are chosen with it), retried on deadlock or serialization failure; an outage (the database
    away, failing over or read-only: `is_transient`) is raised, for the batch to be rewound; any
    other failure is taken as one event's fault, and the batch is redone event by event
    (`isolate_failures`)."""
    for attempt in range(DEADLOCK_RETRIES):
        try:
            with scope.conn.begin():
                begun = scope.begun()
                return apply_batch(begun, events), begun.now
        except Exception as exc:
            if is_conflict(exc) and attempt < DEADLOCK_RETRIES - 1:
                continue
            if is_transient(exc):
                raise
            log.warning("batch transaction failed, isolating the event at fault",
                        extra={"records": len(events), "error": _one_line(exc)})
            result = isolate_failures(scope, events, unrecorded)
            with scope.conn.begin():  # rare: the isolated transactions' now is the next one's
                return result, scope.begun().now
    raise AssertionError("unreachable")


def isolate_failures(scope: BatchScope, events: list[ExpiryEvent],
                     unrecorded: list[Invalid] | None = None) -> BatchResult:
    """Apply each event in its own transaction; one whose transaction fails is dead-lettered as
    invalid in a transaction of its own, or, if the ledger refuses even that (`values_at_fault`),
    appended to `unrecorded` for its raw record to go to the DLQ (without `unrecorded`, raised). An
    outage met on the way is raised: no event is at fault for a read-only or lost database."""
    result = BatchResult()
    failed: list[Invalid] = []
    for event in events:
        try:
            with scope.conn.begin():
                result.absorb(apply_batch(scope.begun(), [event]))
        except Exception as exc:
            if is_transient(exc):
                raise
            failed.append((event, _one_line(exc)))
    for event, reason in failed:
        ids = {"op_key": event.op_key, "correlation_id": event.correlation_id}
        try:
            with scope.conn.begin():
                lettered = dead_letter_events(scope.begun(), [(event, reason)])
        except Exception as exc:
            if is_transient(exc) or unrecorded is None or not values_at_fault(exc):
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


def raw_records(messages: list[Message], positions: dict[str, Position], events: list[Invalid], code: str
                ) -> list[Poison]:
    """The consumed records of `events` that get no ledger row, as poison with `code` and the reason."""
    by_position = {position_of(msg): msg for msg in messages}
    return [poison_of(by_position[positions[event.op_key]], code, f"{event.op_key}: {reason}")
            for event, reason in events if positions.get(event.op_key) in by_position]


def _one_line(exc: BaseException) -> str:
    """The error's type and first line, control characters escaped (it may quote a value)."""
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return one_line(f"{type(cause).__name__}: {first}", 500, escape=True)


def commit_offsets(consumer: Consumer, owned: set[tuple[str, int]], messages: list[Message], *,
                   asynchronous: bool = False, pending: PendingCommits | None = None) -> list[TopicPartition]:
    """Commit last+1 per owned partition seen in `messages` (waiting for the broker unless
    `asynchronous`), passed explicitly, never stored in the consumer first; returns what was
    committed. Sent without waiting with `pending`, they join the offsets still unacknowledged, and
    all of those of owned partitions go together (`offset_commits`)."""
    nxt: dict[tuple[str, int], int] = {}
    for msg in messages:
        topic, partition, offset = position_of(msg)
        nxt[(topic, partition)] = max(nxt.get((topic, partition), -1), offset + 1)
    offsets = [TopicPartition(t, p, o) for (t, p), o in nxt.items() if (t, p) in owned]
    if offsets:
        if asynchronous:
            if pending is not None:
                pending.merge(offsets)
                offsets = pending.to_send(owned)
            if offsets:
                consumer.commit(offsets=offsets, asynchronous=True)
        else:
            consumer.commit(offsets=offsets, asynchronous=False)
    return offsets


def _produce_delayed(ctx: WorkerContext, event: ExpiryEvent, now: datetime) -> None:
    """Queue `event`'s wake-up on its delay tier (a full queue is waited out). A validated event
    is a few KiB, so a refusal for its size is a bug: raised as permanent, never dropped."""
    topic, headers = delay_record(ctx.topics, event.due_at, now)
    refused = produce_or_refusal(ctx.producer, topic, key=event.op_key.encode(),
                                 value=ctx.codec.encode(EXPIRY_EVENT, expiry_record(event, now)),
                                 headers=carried(list(headers), event.traceparent), on_delivery=ctx.delivery)
    if refused is not None:
        raise DeliveryFailed(f"{topic} refused the wake-up of {event.op_key}: {refused.str()}", permanent=True)


def _crash_if(point: str, settings: Settings) -> None:
    """Test hook: die without cleanup at a named point, as a killed process would."""
    if settings.dev.crash_point == point:
        os._exit(17)
