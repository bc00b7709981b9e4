"""The sweep: find due business rows with no ledger row, record them `pending`, emit their events.
For a kind with a generation, "no ledger row" is none for the row's current generation: a subject
that lapses again is new work (docs/design/generations.md).

A due row whose ledger row is `pending` but waiting past now (an event's own far-off due time, or a
subject that did not exist when its event came) is work too: its row is brought forward to now and
its event emitted again; the ledger absorbs the duplicate if one was in flight.

Pages are bounded and walked by a keyset cursor (due time, id). Each page is committed to the
ledger first and then produced and flushed before the next page starts, so a produce failure
leaves `pending` rows the reconciler will find, never a silent gap.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime

from confluent_kafka import Producer
from sqlalchemy import Engine

from lapse.kernel.clock import Clock, engine_now
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import (
    PENDING,
    LedgerWrites,
    bring_forward,
    event_for_row,
    expiry_event,
    insert_pending,
)
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.producers.emit import emit_events

log = get_logger("sweep")

ACTOR = "sweep"
WAITED_PAST_DUE = "brought forward by the sweep: the business row is due"


@dataclass
class SweepReport:
    pages: int = 0
    found: int = 0
    emitted: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


def sweep_kind(engine: Engine, producer: Producer, codec: Codec, settings: Settings,
               kind: CleanupKind, now: datetime, report: SweepReport, *, source: str = "sweep",
               stop: threading.Event | None = None) -> None:
    """Emit one kind's due rows page by page; a set `stop` ends it between pages."""
    delivery = DeliveryTracker()
    cursor = None
    while not (stop and stop.is_set()):
        with engine.begin() as conn:
            rows = [kind.to_eligible(r) for r in conn.execute(kind.eligible_page(
                now, cursor, settings.producer.sweep_page_size, without_ledger=True))]
            if not rows:
                return
            events = [expiry_event(kind.name, r.subject_id, r.tenant, r.due_at, source=source,
                                   generation=r.generation) for r in rows]
            created = set(insert_pending(conn, events, now))
            moved = bring_forward(conn, [e.op_key for e in events if e.op_key not in created], now)
            writes = LedgerWrites(ACTOR, now)
            for row in moved:
                writes.transition(row.op_key, PENDING, PENDING, row.attempt, reason=WAITED_PAST_DUE,
                                  replay_id=row.replay_id, correlation_id=row.correlation_id)
            writes.flush(conn)
        # A brought-forward row's event carries the row's attempt, so it is not taken for a stale one.
        fresh = [e for e in events if e.op_key in created] + [event_for_row(r, source=source) for r in moved]
        emit_events(producer, codec, delivery, settings.topology.expiry, fresh, now)
        cursor = rows[-1].cursor
        report.pages += 1
        report.found += len(rows)
        report.emitted += len(fresh)
        report.by_kind[kind.name] = report.by_kind.get(kind.name, 0) + len(fresh)
        log.info("sweep page emitted", extra={"kind": kind.name, "emitted": len(fresh)})


def sweep_once(engine: Engine, producer: Producer, codec: Codec, settings: Settings,
               kinds: dict[str, CleanupKind],
               clock: Clock | None = None,
               stop: threading.Event | None = None) -> SweepReport:
    """One full pass over every kind's due rows at the pass's now (the database's, unless a
    `clock` is set); a set `stop` ends it between pages."""
    report = SweepReport()
    now = engine_now(engine, clock)
    for kind in kinds.values():
        sweep_kind(engine, producer, codec, settings, kind, now, report, stop=stop)
    return report
