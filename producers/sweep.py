"""The sweep: find due business rows with no ledger row, record them `pending`, emit their events.
For a kind with a generation, "no ledger row" is none for the row's current generation: a subject
that lapses again is new work (docs/design/generations.md).

A due row whose ledger row is `pending` but waiting past now (an event's own far-off due time, or a
subject that did not exist when its event came) is work too: its row is brought forward to now and
its event emitted again; the ledger absorbs the duplicate if one was in flight.

Pages are bounded. Each page is committed to the ledger first and then produced and flushed before
the next page starts, so a produce failure leaves `pending` rows the reconciler will find, never a
silent gap.

Fair, and bounded ahead (docs/design/limits.md): a page takes its rows in turns across tenants
(`FairPages`, weighted by the kind's `tenant_weights`); a pass goes round the kinds a
page at a time, the normal kinds only in rounds where no high-priority kind had a page to emit; and
a kind's pages are emitted only while its events not yet finished fit its window (`EmitWindow`:
about AHEAD_S of the processors' pace).
A backlog therefore waits in the business table, where the next page can still put another
tenant's rows or a high-priority kind first, rather than on the expiry topic in front of them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Producer
from sqlalchemy import Engine

from lapse.kernel.clock import Clock, engine_now
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.kinds import CleanupKind, EligibleRow
from lapse.kernel.ledger import (
    PENDING,
    LedgerWrites,
    bring_forward,
    event_for_row,
    in_flight,
    insert_pending,
)
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.kernel.tracing import SWEEP, span
from lapse.producers.emit import emit_events
from lapse.producers.fair_pages import FairPages

log = get_logger("sweep")

ACTOR = "sweep"
WAITED_PAST_DUE = "brought forward by the sweep: the business row is due"
AHEAD_S = 2.0  # a kind's window: about this long of the processors' pace in flight
STALLED_S = 2.0  # a pass whose windows are full and make no progress this long ends (the next one goes on)
ROOM_POLL_S = 0.1  # how often a pass with full windows looks for room
LOGGED_UNKEYABLE = 10  # rows set aside for their ids logged one by one per pass; the rest are counted


@dataclass
class SweepReport:
    pages: int = 0
    found: int = 0
    emitted: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    stalled: bool = False  # ended with work left because the processors made no room
    unkeyable: int = 0  # due rows set aside: their ids cannot form an op key


class EmitWindow:
    """One kind's emitted events not finished yet (`pending` or `claimed`), kept to about AHEAD_S
    of the pace at which the processors finish them (measured while the window is full), at most
    `limit` and at least `floor`; before any pace is known, `floor` with `slow_start` (a sweep that
    runs on, so the first page is not followed by the rest of a backlog before it is done), else
    `limit`. The ledger is read only when the window looks full."""

    def __init__(self, limit: int, floor: int, *, slow_start: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.floor = min(floor, limit)
        self.slow_start = slow_start
        self.clock = clock
        self.keys: deque[str] = deque()
        self.pace: float | None = None  # finished per second
        self.read_at = clock()
        self.progress_at = clock()

    @property
    def size(self) -> int:
        if self.pace is None:
            return self.floor if self.slow_start else self.limit
        return int(min(self.limit, max(self.floor, self.pace * AHEAD_S)))

    def add(self, keys: list[str]) -> None:
        self.keys.extend(keys)

    def room(self, engine: Engine) -> int:
        """How many more events fit; reads which are still in flight when none seem to."""
        if len(self.keys) < self.size:
            return self.size - len(self.keys)
        with engine.connect() as conn:
            still = in_flight(conn, list(self.keys))
        now = self.clock()
        finished = len(self.keys) - len(still)
        if finished:
            pace = finished / max(now - self.read_at, 1e-3)
            self.pace = pace if self.pace is None else 0.5 * self.pace + 0.5 * pace
            self.progress_at = now
            self.keys = deque(k for k in self.keys if k in still)
        self.read_at = now
        return self.size - len(self.keys)

    def stalled(self) -> bool:
        return self.clock() - self.progress_at >= STALLED_S


def sweep_page(engine: Engine, producer: Producer, codec: Codec, settings: Settings, pages: FairPages,
               limit: int, delivery: DeliveryTracker, report: SweepReport, source: str = "sweep") -> list[str]:
    """Record and emit the next fair page of a kind's due rows (at most `limit`); the op keys
    emitted. An empty page, or one whose rows were all taken by someone else meanwhile, ends the
    kind's pass."""
    kind, now = pages.kind, pages.now
    with engine.begin() as conn:
        while True:  # a page whose ids all cannot form an op key is passed over, not the pass's end
            rows = pages.next_page(conn, limit)
            if not rows:
                return []
            events, aside = kind.events_of(rows, source=source)
            set_aside_unkeyable(kind, aside, report)
            if events:
                break
        created = set(insert_pending(conn, events, now))
        moved = bring_forward(conn, [e.op_key for e in events if e.op_key not in created], now)
        writes = LedgerWrites(ACTOR, now)
        for row in moved:
            writes.transition(row.op_key, PENDING, PENDING, row.attempt, reason=WAITED_PAST_DUE,
                              replay_id=row.replay_id, correlation_id=row.correlation_id)
        writes.flush(conn)
    # A brought-forward row's event carries the row's attempt, so it is not taken for a stale one.
    fresh = [e for e in events if e.op_key in created] + [event_for_row(r, source=source) for r in moved]
    # The page's events share its trace: one span per page, not per event.
    with span(SWEEP, None, {"lapse.kind": kind.name, "lapse.events": len(fresh)}) as traceparent:
        emit_events(producer, codec, delivery, settings.topology.expiry, fresh, now, traceparent)
    report.pages += 1
    report.found += len(rows)
    report.emitted += len(fresh)
    report.by_kind[kind.name] = report.by_kind.get(kind.name, 0) + len(fresh)
    log.info("sweep page emitted", extra={"kind": kind.name, "emitted": len(fresh)})
    return [e.op_key for e in fresh]


def set_aside_unkeyable(kind: CleanupKind, aside: list[tuple[EligibleRow, str]], report: SweepReport) -> None:
    """Count the due rows whose ids cannot form an op key; log the first few of a pass, one line each."""
    for row, reason in aside:
        if report.unkeyable < LOGGED_UNKEYABLE:
            log.warning("due row set aside: its id cannot form an op key", extra={
                "kind": kind.name, "subject_id": one_line(row.subject_id, 200, escape=True),
                "error": one_line(reason, 300, escape=True)})
        report.unkeyable += 1


def sweep_once(engine: Engine, producer: Producer, codec: Codec, settings: Settings,
               kinds: dict[str, CleanupKind],
               clock: Clock | None = None,
               stop: threading.Event | None = None,
               windows: dict[str, EmitWindow] | None = None) -> SweepReport:
    """One pass over every kind's due rows at the pass's now (the database's, unless a `clock` is
    set): in each round a page of every high-priority kind, or, when none had one to emit, of every
    normal kind, each kind while its window has room (`windows`: kept by a long-running sweep across
    passes, each starting small; else fresh ones, starting at `sweep_in_flight`). A set `stop` ends
    it between pages; windows full with no progress for STALLED_S end it too."""
    report = SweepReport()
    now = engine_now(engine, clock)
    page_size = settings.producer.sweep_page_size
    slow_start = windows is not None
    windows = {} if windows is None else windows
    delivery = DeliveryTracker()
    left = list(kinds.values())
    pages = {kind.name: FairPages(kind, now) for kind in left}
    while left:
        emitted = False
        for tier in ([k for k in left if k.high_priority], [k for k in left if not k.high_priority]):
            for kind in tier:
                window = windows.setdefault(kind.name, EmitWindow(settings.producer.sweep_in_flight, page_size,
                                                                  slow_start=slow_start))
                room = window.room(engine)
                if room <= 0:
                    continue
                if stop and stop.is_set():  # asked before each page: the page in hand is finished
                    return report
                keys = sweep_page(engine, producer, codec, settings, pages[kind.name], min(page_size, room), delivery,
                                  report)
                if keys:
                    window.add(keys)
                    emitted = True
                else:
                    left.remove(kind)
            if emitted:
                break  # a normal kind gets a page only in a round where no high-priority kind emitted one
        if left and not emitted:
            if all(windows[k.name].stalled() for k in left):
                report.stalled = True
                log.info("sweep pass ends with work left: the processors made no room",
                         extra={"kinds": [k.name for k in left]})
                break
            if stop and stop.wait(ROOM_POLL_S):
                break
            if not stop:
                time.sleep(ROOM_POLL_S)
    return report
