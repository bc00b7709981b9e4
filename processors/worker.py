"""The cleanup worker: consume a batch, decode it, hand it to `commit_batch`, repeat.

Partition ownership comes from the rebalance callbacks; a batch's offsets are committed before
the next consume call, so a revoke (which only happens inside consume) finds nothing pending.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import DeliveryTracker, make_consumer, make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, is_transient
from lapse.kernel.settings import Settings
from lapse.processors.circuit import CircuitPolicy, DeadLetterCircuit
from lapse.processors.commit import BatchContext, commit_batch
from lapse.processors.decode import decode_batch, partition_of, position_of
from lapse.processors.metrics import observe_batch
from lapse.processors.rewind import rewind_and_back_off

log = get_logger("processor")

# How long a worker that never got an assignment waits for the broker's metadata before it
# reports the broker unreachable (`run(exit_when_idle=…)` only).
BROKER_PROBE_S = 10.0


@dataclass
class WorkerStats:
    batches: int = 0
    consumed: int = 0
    applied: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    conflicts: int = 0
    poison: int = 0
    delayed: int = 0
    batch_failures: int = 0
    started: float = field(default_factory=time.monotonic)


class CleanupWorker:
    """One consumer in group `lapse-cleanup`; run several for more partitions in parallel."""

    def __init__(self, settings: Settings, *, stop: threading.Event | None = None) -> None:
        self.settings = settings
        self.stop = stop or threading.Event()
        self.stats = WorkerStats()
        self.owned: set[tuple[str, int]] = set()
        self.at_eof: set[tuple[str, int]] = set()
        self.reached_broker = False  # an assignment (even an empty one) or metadata came back
        self.engine = engine_from_settings(settings)
        self.ctx = BatchContext(
            settings=settings,
            engine=self.engine,
            codec=Codec.from_settings(settings),
            kinds=load_kinds(settings, self.engine),
            producer=make_producer(settings),
            delivery=DeliveryTracker(),
        )
        self.consumer = make_consumer(settings, settings.topology.groups.cleanup)
        self.circuit = DeadLetterCircuit(CircuitPolicy(
            threshold=settings.processor.circuit_threshold, min_events=settings.processor.circuit_min_events,
            window=settings.processor.circuit_window, cooldown_s=settings.processor.circuit_cooldown_s))
        self.next_offset: dict[tuple[str, int], int] = {}
        self.outage = Outage("processor", log)

    def _on_assign(self, consumer, partitions) -> None:
        self.reached_broker = True
        self.owned |= {(p.topic, p.partition) for p in partitions}
        log.info("partitions assigned", extra={"partitions": sorted(p.partition for p in partitions)})

    def _on_revoke(self, consumer, partitions) -> None:
        # Every batch commits before the next consume, so there is nothing done-but-uncommitted.
        revoked = {(p.topic, p.partition) for p in partitions}
        self.owned -= revoked
        self.at_eof -= revoked
        self.circuit.forget(revoked)
        log.info("partitions revoked", extra={"partitions": sorted(p for _, p in revoked)})

    def run(self, exit_when_idle: float | None = None) -> WorkerStats:
        """Process until stopped (SIGTERM/SIGINT or `stop`), or idle for `exit_when_idle` seconds."""
        self.consumer.subscribe(
            [self.settings.topology.expiry], on_assign=self._on_assign,
            on_revoke=self._on_revoke, on_lost=self._on_revoke,
        )
        last_activity = time.monotonic()
        try:
            while not self.stop.is_set():
                self._close_circuits()
                messages = self._consume()
                if messages:
                    last_activity = time.monotonic()
                    try:
                        self._process(messages)
                        self.outage.over()
                    except Exception as exc:
                        if not is_transient(exc):
                            raise
                        self._retry_later(messages, exc)
                elif exit_when_idle is not None and self._idle(last_activity, exit_when_idle):
                    break
        finally:
            self.close()
        return self.stats

    def _retry_later(self, messages: list, exc: Exception) -> None:
        """A batch failed for a reason outside it (`is_transient`: the database, the broker or the
        schema registry away): nothing of it was committed, so it is rewound and tried again after
        the outage's backoff (`rewind_and_back_off`)."""
        self.stats.batch_failures += 1
        rewind_and_back_off(self.consumer, self.owned, messages, exc, self.outage, self.stop)

    def _idle(self, last_activity: float, idle_s: float) -> bool:
        """Caught up on every owned partition for `idle_s`; a worker with no partitions waits a
        further two session timeouts, since a rebalance may still hand it some. A worker that never
        heard from the broker does not call that idle: it asks for metadata, and the
        KafkaException of an unreachable broker ends the run (never an exit as if all was done)."""
        quiet = time.monotonic() - last_activity
        if self.owned:
            active = {tp for tp in self.owned if not self.circuit.is_open(tp)}
            return active <= self.at_eof and quiet >= idle_s
        if not self.reached_broker and quiet >= idle_s:
            self.consumer.list_topics(self.settings.topology.expiry, timeout=BROKER_PROBE_S)
            self.reached_broker = True
        return quiet >= idle_s + 2 * self.settings.processor.session_timeout_ms / 1000

    def _consume(self) -> list:
        batch = self.consumer.consume(self.settings.processor.batch_size, self.settings.processor.poll_timeout_s)
        messages = []
        for msg in batch:
            err = msg.error()
            if err is None:
                tp = partition_of(msg)
                if tp in self.owned and not self.circuit.is_open(tp):
                    self.at_eof.discard(tp)
                    messages.append(msg)
            elif err.code() == KafkaError._PARTITION_EOF:
                self.at_eof.add(partition_of(msg))
            elif err.fatal():
                raise KafkaException(err)
            else:
                log.warning("consumer error", extra={"error": err.str()})
        return messages

    def _process(self, messages: list) -> None:
        started = time.monotonic()
        events, positions, poison = decode_batch(messages, self.ctx.codec, self.ctx.kinds)
        # Poison is logged as dead-lettered by commit_batch, once the DLQ has acknowledged it.
        result = commit_batch(self.ctx, self.consumer, self.owned, messages, events, positions, poison)
        for msg in messages:
            topic, partition, offset = position_of(msg)
            self.next_offset[(topic, partition)] = offset + 1
        self._feed_circuit(result, positions, poison)
        s = self.stats
        s.batches += 1
        s.consumed += len(messages)
        s.applied += len(result.applied)
        s.skipped += len(result.skipped)
        s.dead_lettered += len(result.dead_lettered)
        s.duplicates += result.duplicates
        s.conflicts += len(result.conflicts)
        s.poison += len(poison)
        s.delayed += len(result.not_due)
        observe_batch(len(messages), result, events, len(poison), time.monotonic() - started)
        log.debug("batch committed", extra={
            "records": len(messages), "applied": len(result.applied),
            "duplicates": result.duplicates, "ms": round((time.monotonic() - started) * 1000, 1)})

    def _feed_circuit(self, result, positions, poison) -> None:
        """Count each partition's good and failed outcomes; pause the ones that trip."""
        counts: dict[tuple[str, int], list[int]] = {}
        for keys, slot in ((result.applied, 0), (result.skipped, 0),
                           (result.dead_lettered, 1), (result.retried, 1)):
            for key in keys:
                topic, partition, _ = positions[key]
                counts.setdefault((topic, partition), [0, 0])[slot] += 1
        for item in poison:
            counts.setdefault((item.topic, item.partition), [0, 0])[1] += 1
        for tp, (good, bad) in counts.items():
            if tp in self.owned and self.circuit.record(tp, good, bad):
                self.consumer.pause([TopicPartition(*tp)])
                log.error("dead-letter circuit open: partition paused", extra={
                    "topic": tp[0], "partition": tp[1],
                    "cooldown_s": self.settings.processor.circuit_cooldown_s,
                    "threshold": self.settings.processor.circuit_threshold})

    def _close_circuits(self) -> None:
        """Resume partitions whose cooldown passed, from the first offset not yet committed."""
        for tp in self.circuit.due_to_close():
            if tp not in self.owned:
                continue
            self.consumer.resume([TopicPartition(*tp)])
            if tp in self.next_offset:
                self.consumer.seek(TopicPartition(tp[0], tp[1], self.next_offset[tp]))
            log.warning("dead-letter circuit closed: partition resumed",
                        extra={"topic": tp[0], "partition": tp[1]})

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            if self.ctx.effects is not None:  # HTTP clients and object-store sessions of the effects
                self.ctx.effects.close()
            self.ctx.producer.flush(10)
            self.engine.dispose()
