"""The cleanup worker: consume a batch, decode it, hand it to `commit_batch`, repeat.

A batch's `commit_batch` runs on a batch thread while the next batch is consumed and decoded
(`lapse.processors.in_flight`, which argues why that keeps the commit order). Partition ownership
comes from the rebalance callbacks, which collect the batch in flight before anything changes
hands; a revoke then commits the revoked partitions' offsets synchronously, as does closing.
Between batches offsets are committed without waiting for the broker's acknowledgement.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.findings import CIRCUIT, Finding, record_quietly
from lapse.kernel.kafka_clients import DeliveryTracker, make_consumer, make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import ExpiryEvent, Position
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, is_transient
from lapse.kernel.settings import Settings
from lapse.processors.circuit import CircuitPolicy, DeadLetterCircuit
from lapse.processors.commit import WorkerContext, commit_batch
from lapse.processors.decode import Poison, decode_batch, partition_of, position_of
from lapse.processors.in_flight import Collected, InFlight
from lapse.processors.metrics import observe_batch, observe_circuit_opened
from lapse.processors.offset_commits import PendingCommits
from lapse.processors.rewind import rewind_and_back_off
from lapse.processors.scope import BatchResult

log = get_logger("processor")

# How long a worker that never got an assignment waits for the broker's metadata before it
# reports the broker unreachable (`run(exit_when_idle=…)` only).
BROKER_PROBE_S = 10.0
# How long one wait for more records lasts while a batch is in flight (the worker then checks
# whether that batch is done).
TOP_UP_S = 0.005
# How often the interpreter lock changes hands between the worker's two threads (the default is 5 ms).
GIL_SWITCH_S = 0.0005
# A commit that waits for the broker (on a revoke, on close) and is refused for a reason that may
# pass, such as the group coordinator moving, is tried this many times, this far apart.
COMMIT_ATTEMPTS, COMMIT_RETRY_S = 6, 0.5


Decoded = tuple[list[ExpiryEvent], dict[str, Position], list[Poison]]  # what decode_batch returns


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
        # No ping before each batch (a round trip): a dead connection fails the batch as an outage,
        # which rewinds it, and the pool replaces the connection.
        self.engine = engine_from_settings(settings, pre_ping=False)
        self.ctx = WorkerContext(
            settings=settings,
            engine=self.engine,
            codec=Codec.from_settings(settings),
            kinds=load_kinds(settings, self.engine),
            producer=make_producer(settings),
            delivery=DeliveryTracker(),
            commit_asynchronously=True,
        )
        # The batch thread waits on the database while this thread decodes the next batch: with
        # the interpreter's default 5 ms switch interval, each answer the batch thread gets could
        # wait up to 5 ms more for the interpreter lock. Handed over sooner, the overlap pays.
        sys.setswitchinterval(GIL_SWITCH_S)
        self.in_flight: InFlight[BatchResult] = InFlight("lapse-batch")
        self.ctx.on_consumer_thread = self.in_flight.on_consumer_thread
        self.pending = self.ctx.pending_commits = PendingCommits()
        # Small per-partition fetches interleave the partitions in every batch (docs/design/limits.md).
        self.consumer = make_consumer(settings, settings.topology.groups.cleanup, on_commit=self._on_commit,
                                      **{"max.partition.fetch.bytes": settings.processor.partition_fetch_bytes})
        self.circuit = DeadLetterCircuit(CircuitPolicy(
            threshold=settings.processor.circuit_threshold, min_events=settings.processor.circuit_min_events,
            window=settings.processor.circuit_window, cooldown_s=settings.processor.circuit_cooldown_s))
        self.next_offset: dict[tuple[str, int], int] = {}
        self.outage = Outage("processor", log, settings=settings)
        self.closing = False  # set once close() has made its last commit
        self.failed: Collected[BatchResult] | None = None  # a batch that failed, until the loop rewinds it
        # Owned partitions paused while commits stall (`_hold_while_commits_stall`); None between stalls.
        self.held_back: set[tuple[str, int]] | None = None

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker's answer to an offset commit sent without waiting (served inside consume): a
        refusal is logged, and its offsets stay pending, sent again until accepted."""
        if err is not None:
            log.warning("offset commit refused: sent again", extra={"error": err.str()})
        moved_back = self.pending.moved_back
        self.pending.answered(err, partitions)
        if self.pending.moved_back > moved_back:
            log.warning("an older offset commit was accepted after a newer one: the newer is sent again",
                        extra={"partitions": self.pending.moved_back - moved_back})

    def _resend_commits(self) -> None:
        """Send again, without waiting, the offsets whose commit went unanswered or was refused."""
        if self.pending.due():
            offsets = self.pending.to_send(self.owned)
            if offsets:
                self.consumer.commit(offsets=offsets, asynchronous=True)

    def _on_assign(self, consumer, partitions) -> None:
        self._collect()
        self.reached_broker = True
        assigned = {(p.topic, p.partition) for p in partitions}
        self.owned |= assigned
        self._catch_up(assigned)
        if self.held_back is not None:  # assigned while commits stall: read once they are accepted
            self.held_back |= assigned
            self.consumer.pause(partitions)
        log.info("partitions assigned", extra={"partitions": sorted(p.partition for p in partitions)})

    def _catch_up(self, assigned: set[tuple[str, int]]) -> None:
        """Partitions given back after this worker lost them with their commits unaccepted (its
        session expired while the group coordinator moved): the work it did for them is durable, so
        their offsets are committed now, forward only, and reading resumes after that work."""
        back = self.pending.given_back(assigned)
        if not back:
            return
        try:
            found = self.consumer.committed([TopicPartition(t, p) for t, p in sorted(back)], timeout=10)
        except KafkaException as exc:
            log.warning("committed offsets unreadable: the work before is delivered again", extra={"error": str(exc)})
            return
        group = {(tp.topic, tp.partition): tp.offset for tp in found}
        ahead = {tp: offset for tp, offset in back.items() if offset > group.get(tp, -1)}
        if ahead:
            self.next_offset.update(ahead)
            self._commit_now(set(ahead))

    def _on_revoke(self, consumer, partitions) -> None:
        """Collect the batch in flight (it commits while the partitions are still ours), commit the
        revoked partitions' offsets synchronously, then give them up."""
        self._collect()
        revoked = {(p.topic, p.partition) for p in partitions}
        if not self.closing:  # close() has committed already: no commit while the group terminates
            self._commit_now(revoked & self.owned)
        self._give_up(revoked)

    def _on_lost(self, consumer, partitions) -> None:
        """Partitions already taken from us (the session expired): nothing may be committed while
        they are not ours; their offsets are set aside in case the group gives them back."""
        self._collect()
        lost = {(p.topic, p.partition) for p in partitions}
        self.pending.set_aside({tp: offset for tp, offset in self.next_offset.items() if tp in lost})
        self._give_up(lost)

    def _give_up(self, partitions: set[tuple[str, int]]) -> None:
        # librdkafka keeps a partition paused across a rebalance: one paused here (its circuit open,
        # or held while commits stall) is resumed as it goes, or, given back to this worker later,
        # it would never be read again.
        held = self.held_back if self.held_back is not None else set()
        if paused := [TopicPartition(*tp) for tp in sorted(partitions)
                      if self.circuit.is_open(tp) or tp in held]:
            self.consumer.resume(paused)
        held -= partitions
        for tp in partitions:  # a later owner moves on: our offsets must not be committed again
            self.next_offset.pop(tp, None)
        self.pending.forget(partitions)
        self.owned -= partitions
        self.at_eof -= partitions
        self.circuit.forget(partitions)
        log.info("partitions revoked", extra={"partitions": sorted(p for _, p in partitions)})

    def _commit_now(self, partitions: set[tuple[str, int]]) -> None:
        """Commit, waiting for the broker, the next offset of each of `partitions` a batch finished;
        a refusal that may pass (the coordinator moving) is tried again, a few times
        (COMMIT_ATTEMPTS). A refusal that stays (the group already moved on) is logged: the next
        owner then redelivers, and the ledger absorbs it."""
        offsets = [TopicPartition(t, p, self.next_offset[(t, p)]) for t, p in sorted(partitions)
                   if (t, p) in self.next_offset]
        if not offsets:
            return
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self.pending.accepted(self.consumer.commit(offsets=offsets, asynchronous=False) or [])
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if attempt < COMMIT_ATTEMPTS and err is not None and err.retriable():
                    time.sleep(COMMIT_RETRY_S)
                    continue
                log.warning("offset commit refused: the next owner redelivers from its last commit",
                            extra={"error": str(exc)})
                return

    def run(self, exit_when_idle: float | None = None) -> WorkerStats:
        """Process until stopped (SIGTERM/SIGINT or `stop`), or idle for `exit_when_idle` seconds."""
        self.consumer.subscribe(
            [self.settings.topology.expiry], on_assign=self._on_assign,
            on_revoke=self._on_revoke, on_lost=self._on_lost,
        )
        last_activity = time.monotonic()
        try:
            while not self.stop.is_set():
                self._close_circuits()
                self._resend_commits()
                messages = self._consume()
                if messages:
                    last_activity = time.monotonic()
                try:
                    decoded = self._decode(messages)  # overlaps the batch in flight
                except Exception as exc:
                    self._collect()
                    if self._rethrow_failure(messages):  # rewinds these records too
                        continue
                    if not is_transient(exc):
                        raise
                    self._retry_later(messages, exc)
                    continue
                self._collect()
                if self._rethrow_failure(messages):
                    continue
                if messages:
                    messages, decoded = self._without_open_circuits(messages, decoded)
                if messages:
                    messages, decoded = self._hold_while_commits_stall(messages, decoded)
                if messages:
                    self._hand_over(messages, decoded)
                elif exit_when_idle is not None and self._idle(last_activity, exit_when_idle):
                    break
        finally:
            self.close()
        return self.stats

    def _hold_while_commits_stall(self, messages: list[Message], decoded: Decoded) -> tuple[list[Message], Decoded]:
        """While offsets already sent are refused or go unanswered (the group coordinator moving),
        the next batch waits with consumption paused, its commits sent again: what the worker did
        meanwhile would be delivered again if the group rebalanced before they are accepted. Returns
        the batch as it goes on: without partitions given up meanwhile, with records the consumer
        still handed over while paused."""
        if not self.pending.stalled():
            return messages, decoded
        self.held_back = {tp for tp in self.owned if not self.circuit.is_open(tp)}
        self.consumer.pause([TopicPartition(t, p) for t, p in sorted(self.held_back)])
        log.warning("offset commits refused or unanswered: the next batch waits until they are accepted")
        more: list[Message] = []
        try:
            while self.pending.stalled() and not self.stop.is_set():
                self._resend_commits()
                more += self._consume()  # serves the answers and any rebalance meanwhile
        finally:
            held, self.held_back = self.held_back or set(), None
            if ready := [TopicPartition(t, p) for t, p in sorted(held) if not self.circuit.is_open((t, p))]:
                self.consumer.resume(ready)
        kept = [m for m in [*messages, *more] if partition_of(m) in self.owned]
        if not more and len(kept) == len(messages):
            return messages, decoded
        try:
            return kept, self._decode(kept)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self._retry_later(kept, exc)
            return [], ([], {}, [])

    def _rethrow_failure(self, behind: list[Message]) -> bool:
        """If the batch in flight failed: raise its error, or (for an outage) rewind it together
        with the batch consumed behind it and wait the outage out. Returns whether it failed."""
        failed, self.failed = self.failed, None
        if failed is None or failed.error is None:
            return False
        if not is_transient(failed.error):
            raise failed.error
        self._retry_later([*failed.messages, *behind], failed.error)
        return True

    def _retry_later(self, messages: list, exc: BaseException) -> None:
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
        """The next batch, batched by what arrives (up to `batch_size`): while a batch is in flight,
        what arrives until it is done; with none in flight, what is already fetched, or else the
        first record within `poll_timeout_s` and whatever came with it. Under a backlog every batch
        is full; under a light load a record waits about one batch's time, not for a batch to fill."""
        size = self.settings.processor.batch_size
        batch = self.consumer.consume(size, 0)
        if self.in_flight.busy:
            while len(batch) < size and not self.in_flight.ready():
                batch += self.consumer.consume(size - len(batch), TOP_UP_S)
        elif not batch:
            first = self.consumer.poll(self.settings.processor.poll_timeout_s)
            if first is not None:
                batch = [first, *(self.consumer.consume(size - 1, 0) if size > 1 else [])]
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

    def _decode(self, messages: list[Message]) -> Decoded:
        if not messages:
            return [], {}, []
        return decode_batch(messages, self.ctx.codec, self.ctx.kinds)

    def _without_open_circuits(self, messages: list[Message], decoded: Decoded) -> tuple[list[Message], Decoded]:
        """Drop the records of partitions whose circuit the collected batch just opened (they are read
        again from the next offset when it closes); the rest is decoded again only then."""
        kept = [m for m in messages if not self.circuit.is_open(partition_of(m))]
        if len(kept) == len(messages):
            return messages, decoded
        return kept, self._decode(kept)

    def _hand_over(self, messages: list[Message], decoded: Decoded) -> None:
        """Start the batch's `commit_batch` on the batch thread."""
        events, positions, poison = decoded
        self.in_flight.submit(messages, decoded, lambda: commit_batch(
            self.ctx, self.consumer, self.owned, messages, events, positions, poison))

    def _collect(self) -> None:
        """Wait for the batch in flight and count it; a failure is kept for the loop to rewind."""
        collected = self.in_flight.collect()
        if collected is None:
            return
        if collected.error is not None:
            self.failed = collected
            return
        self.outage.over()
        self._count(collected)

    def _count(self, collected: Collected[BatchResult]) -> None:
        result, messages = collected.result, collected.messages
        events, positions, poison = collected.decoded
        assert result is not None
        for msg in messages:
            topic, partition, offset = position_of(msg)
            self.next_offset[(topic, partition)] = offset + 1
        # Poison is logged as dead-lettered by commit_batch, once the DLQ has acknowledged it.
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
        observe_batch(len(messages), result, events, len(poison), collected.seconds)
        log.debug("batch committed", extra={
            "records": len(messages), "applied": len(result.applied),
            "duplicates": result.duplicates, "ms": round(collected.seconds * 1000, 1)})

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
                observe_circuit_opened()
                log.error("dead-letter circuit open: partition paused", extra={
                    "topic": tp[0], "partition": tp[1],
                    "cooldown_s": self.settings.processor.circuit_cooldown_s,
                    "threshold": self.settings.processor.circuit_threshold})
                self._record_circuit(tp, opened=True, failed=bad, seen=good + bad)

    def _record_circuit(self, tp: tuple[str, int], *, opened: bool, failed: int = 0, seen: int = 0) -> None:
        """Keep the circuit's state as this worker's finding on the partition (status and the
        console show the open ones); a database that cannot take it is a logged warning."""
        # For status and the console only: the circuit itself runs on the monotonic clock.
        now, cooldown = datetime.now(UTC), self.settings.processor.circuit_cooldown_s
        if opened:
            summary = (f"open: {failed} of the last batch's {seen} outcomes failed; paused for {cooldown:g}s "
                       f"by {self.settings.runtime.worker_id}")
            until = now + timedelta(seconds=cooldown)
        else:
            summary, until = f"closed: resumed by {self.settings.runtime.worker_id}", now
        record_quietly(self.engine, Finding(CIRCUIT, f"{tp[0]}[{tp[1]}]", now, summary, {
            "topic": tp[0], "partition": tp[1], "open": opened, "worker": self.settings.runtime.worker_id,
            "threshold": self.settings.processor.circuit_threshold, "cooldown_s": cooldown}, until))

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
            self._record_circuit(tp, opened=False)

    def close(self) -> None:
        """Collect the batch in flight, commit what finished synchronously, and close every client."""
        try:
            self._collect()
            self.in_flight.close()
            self._commit_now(set(self.owned))
            self.closing = True
            self.consumer.close()
        finally:
            if self.ctx.effects is not None:  # HTTP clients and object-store sessions of the effects
                self.ctx.effects.close()
            self.ctx.producer.flush(10)
            self.engine.dispose()
