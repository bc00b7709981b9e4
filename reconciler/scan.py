"""The reconciler: rescan business tables and the ledger for work that lapsed but was forgotten.

Independently of the sweep's cursor it finds, past a grace period: eligible rows with no ledger row,
eligible rows whose `pending` ledger row waits past now (an event's own far-off due time, or a
subject that did not exist when its event came: brought forward to now), and ledger rows stuck in
`pending`, `claimed` (lease long expired) or `retry_scheduled` (due long ago). It re-emits them
with `source=reconciler` the normal way (ledger first, then produce to lapse.expiry and flush),
paced by a token bucket. An `applied` or `skipped` row whose business
record still looks eligible is an anomaly: reported, never fixed here. For a kind with a generation
the row that counts is that of the business row's current generation: an eligible row whose earlier
lapse was applied is a new generation (a gap, `new_generation`, re-emitted), not an anomaly.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from confluent_kafka import Producer
from sqlalchemy import Engine

from lapse.kernel.clock import Clock, engine_now
from lapse.kernel.codec import Codec
from lapse.kernel.findings import LAST_PASS, RECONCILE, Finding, record_quietly
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.kinds import CleanupKind, EligibleRow
from lapse.kernel.ledger import (
    APPLIED,
    CLAIMED,
    PENDING,
    RETRY_SCHEDULED,
    SKIPPED,
    ExpiryEvent,
    LedgerWrites,
    bring_forward,
    event_for_row,
    insert_pending,
    mark_stuck,
    stuck_cursor,
)
from lapse.kernel.logs import get_logger
from lapse.kernel.rate_limit import TokenBucket
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.producers import emit_events
from lapse.reconciler import queries
from lapse.reconciler.release import release_parked_work

log = get_logger("reconciler")

SOURCE = "reconciler"
ACTOR = "reconciler"
NO_LEDGER = "no_ledger"
WAITING_PAST_DUE = queries.WAITING_PAST_DUE  # a due row whose pending ledger row waits past now
NEW_GENERATION = queries.NEW_GENERATION  # a subject that lapsed again: no row for its current generation
ANOMALY_REASONS = {APPLIED: "applied_but_eligible", SKIPPED: "skipped_but_eligible"}
UNKEYABLE = "unkeyable_id"  # an eligible row whose id (or generation) cannot form an op key
# The ledger states the reconciler re-emits when stuck, with the reason it reports for each.
STUCK_REASONS = {PENDING: "stuck_pending", CLAIMED: "stuck_claimed", RETRY_SCHEDULED: "stuck_retry"}
MAX_ANOMALY_KEYS = 100


@dataclass
class ReconcileReport:
    """What one pass saw and did: business rows read (`scanned`), stuck ledger rows found and
    marked (`ledger_scanned`), gaps by reason, events re-emitted, anomalies by reason and at most
    MAX_ANOMALY_KEYS of their op keys."""

    scanned: int = 0
    ledger_scanned: int = 0
    pages: int = 0
    gaps: dict[str, int] = field(default_factory=dict)
    reemitted: int = 0
    released: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    anomaly_keys: list[str] = field(default_factory=list)

    def count(self, bucket: dict[str, int], reason: str, n: int = 1) -> None:
        bucket[reason] = bucket.get(reason, 0) + n

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self, *, stopped: bool = False) -> str:
        """The pass in one line, as status and the console show it."""
        found = sum(self.gaps.values())
        line = (f"{found} missed or stuck ({', '.join(f'{r} {n}' for r, n in sorted(self.gaps.items())) or 'none'}), "
                f"{self.reemitted} re-emitted, {self.released} parked released, "
                f"{sum(self.anomalies.values())} anomalies; "
                f"{self.scanned} business rows and {self.ledger_scanned} ledger rows read")
        return line + (" (stopped before the end)" if stopped else "")


class Reconciler:
    """One reconciler process's state: clients, kinds, clock and pacing; `run_once` is one pass."""

    def __init__(self, engine: Engine, producer: Producer, codec: Codec, settings: Settings,
                 kinds: dict[str, CleanupKind], *,
                 clock: Clock | None = None,
                 bucket: TokenBucket | None = None, stop: threading.Event | None = None) -> None:
        self.engine = engine
        self.stop = stop or threading.Event()  # set: the pass ends between pages
        self.producer = producer
        self.codec = codec
        self.settings = settings
        self.kinds = kinds
        self.clock = clock
        self.bucket = bucket or TokenBucket(settings.reconciler.rate, sleep=self._pause)
        self.delivery = DeliveryTracker()
        self.page_size = settings.reconciler.page_size

    def _pause(self, seconds: float) -> None:
        """The rate limit's wait, cut short by a stop."""
        self.stop.wait(seconds)

    def run_once(self) -> ReconcileReport:
        """One full pass: parked work whose brake is off released, every kind's business table,
        then the stuck ledger states."""
        report = ReconcileReport()
        report.released = release_parked_work(self.engine, self.kinds, self.settings.topology, clock=self.clock,
                                  page_size=self.page_size, stop=self.stop).released
        now = engine_now(self.engine, self.clock)  # the pass's now: the database's unless a clock is set
        cutoff = now - timedelta(seconds=self.settings.reconciler.grace_s)
        for kind in self.kinds.values():
            self._scan_kind(kind, cutoff, now, report)
        for state in STUCK_REASONS:
            self._scan_stuck(state, cutoff, now, report)
        log.info("reconcile pass", extra={k: v for k, v in report.to_dict().items() if k != "anomaly_keys"})
        record_quietly(self.engine, Finding(RECONCILE, LAST_PASS, now, report.summary(stopped=self.stop.is_set()),
                                            report.to_dict()))
        return report

    def _scan_kind(self, kind: CleanupKind, cutoff: datetime, now: datetime,
                   report: ReconcileReport) -> None:
        cursor = None
        while not self.stop.is_set():
            with self.engine.connect() as conn:
                page = queries.eligible_page(conn, kind, cutoff, cursor, self.page_size, now)
            if not page.rows_scanned:
                return
            report.pages += 1
            report.scanned += page.rows_scanned
            missing: dict[str, list[EligibleRow]] = {}
            waiting = []
            for row, state in page.attention:
                if state is None or state == NEW_GENERATION:
                    missing.setdefault(state or NO_LEDGER, []).append(row)
                elif state == WAITING_PAST_DUE:
                    waiting.append(kind.op_key(row.subject_id, row.generation))
                elif state in ANOMALY_REASONS:
                    self._anomaly(report, ANOMALY_REASONS[state], kind.op_key(row.subject_id, row.generation))
            for reason, rows in missing.items():
                self._reemit_missing(kind, rows, reason, now, report)
            if waiting:
                self._reemit_waiting(waiting, now, report)
            cursor = page.cursor
            if page.rows_scanned < self.page_size:
                return

    def _anomaly(self, report: ReconcileReport, reason: str, key: str) -> None:
        report.count(report.anomalies, reason)
        if len(report.anomaly_keys) < MAX_ANOMALY_KEYS:
            report.anomaly_keys.append(key)
        log.warning("ledger says done but the business row is still eligible",
                    extra={"op_key": key, "reason": reason})

    def _reemit_missing(self, kind: CleanupKind, rows: list[EligibleRow], reason: str, now: datetime,
                        report: ReconcileReport) -> None:
        """Record and emit the work of eligible rows with no ledger row (`reason`: none at all, or
        none for the row's current generation while an earlier one has one)."""
        events, aside = kind.events_of(rows, source=SOURCE)
        for row, why in aside:  # a business row the pipeline cannot name: an anomaly, never the pass's end
            report.count(report.anomalies, UNKEYABLE)
            if report.anomalies[UNKEYABLE] <= MAX_ANOMALY_KEYS:
                log.warning("eligible row set aside: its id cannot form an op key", extra={
                    "kind": kind.name, "subject_id": one_line(row.subject_id, 200, escape=True),
                    "error": one_line(why, 300, escape=True)})
        if not events:
            return
        self.bucket.acquire(len(events))
        with self.engine.begin() as conn:
            created = set(insert_pending(conn, events, now))
            fresh = [e for e in events if e.op_key in created]  # the others: the sweep got there first
            writes = LedgerWrites(ACTOR, now)
            for event in fresh:
                writes.transition(event.op_key, None, PENDING, event.attempt, reason=reason,
                                  correlation_id=event.correlation_id)
            writes.flush(conn)
        report.count(report.gaps, reason, len(fresh))
        self._produce(fresh, now, report)

    def _reemit_waiting(self, op_keys: list[str], now: datetime, report: ReconcileReport) -> None:
        """Bring forward the `pending` rows of due subjects still waiting past now, and emit their
        events again (with the row's attempt); a row claimed meanwhile is left to its claimer."""
        self.bucket.acquire(len(op_keys))
        with self.engine.begin() as conn:
            rows = bring_forward(conn, op_keys, now)
            writes = LedgerWrites(ACTOR, now)
            for r in rows:
                writes.transition(r.op_key, PENDING, PENDING, r.attempt, reason=WAITING_PAST_DUE,
                                  replay_id=r.replay_id, correlation_id=r.correlation_id)
            writes.flush(conn)
        report.count(report.gaps, WAITING_PAST_DUE, len(rows))
        self._produce([event_for_row(r, source=SOURCE) for r in rows], now, report)

    def _scan_stuck(self, state: str, cutoff: datetime, now: datetime, report: ReconcileReport) -> None:
        reason = STUCK_REASONS[state]
        cursor = None
        while not self.stop.is_set():
            with self.engine.begin() as conn:
                rows = mark_stuck(conn, state, cutoff, cursor, self.page_size, now)
                writes = LedgerWrites(ACTOR, now)
                for r in rows:
                    writes.transition(r.op_key, state, state, r.attempt, reason=reason,
                                      replay_id=r.replay_id, correlation_id=r.correlation_id)
                writes.flush(conn)
            if not rows:
                return
            report.pages += 1
            report.ledger_scanned += len(rows)
            report.count(report.gaps, reason, len(rows))
            self.bucket.acquire(len(rows))
            self._produce([event_for_row(r, source=SOURCE) for r in rows], now, report)
            cursor = stuck_cursor(state, rows[-1])
            if len(rows) < self.page_size:
                return

    def _produce(self, events: list[ExpiryEvent], now: datetime, report: ReconcileReport) -> None:
        """Produce to lapse.expiry and flush; a failure raises DeliveryFailed and the ledger rows,
        already marked, come back to a later pass once the grace period has passed again."""
        if not events:
            return
        emit_events(self.producer, self.codec, self.delivery, self.settings.topology.expiry, events, now)
        report.reemitted += len(events)
        for event in events:
            log.debug("re-emitted", extra={"op_key": event.op_key, "correlation_id": event.correlation_id})


def reconcile_once(engine: Engine, producer: Producer, codec: Codec, settings: Settings,
                   kinds: dict[str, CleanupKind], *,
                   clock: Clock | None = None) -> ReconcileReport:
    """The reconcile entry point: one pass with the settings' grace, page size and rate."""
    return Reconciler(engine, producer, codec, settings, kinds, clock=clock).run_once()


def scan_rate(engine: Engine, producer: Producer, codec: Codec, settings: Settings,
              kinds: dict[str, CleanupKind]) -> tuple[ReconcileReport, float]:
    """One pass and the rows it scanned per second (business plus ledger rows), for benchmarks."""
    started = time.perf_counter()
    report = reconcile_once(engine, producer, codec, settings, kinds)
    elapsed = time.perf_counter() - started
    return report, (report.scanned + report.ledger_scanned) / elapsed if elapsed > 0 else 0.0
