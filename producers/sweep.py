"""The sweep: find due business rows with no ledger row, record them `pending`, emit their events.

Pages are bounded and walked by a keyset cursor (due time, id). Each page is committed to the
ledger first and then produced and flushed before the next page starts, so a produce failure
leaves `pending` rows the reconciler will find, never a silent gap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from confluent_kafka import Producer
from sqlalchemy import Engine

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import expiry_event, insert_pending
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.producers.emit import emit_events

log = get_logger("sweep")


@dataclass
class SweepReport:
    pages: int = 0
    found: int = 0
    emitted: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


def sweep_kind(engine: Engine, producer: Producer, codec: Codec, settings: Settings,
               kind: CleanupKind, now: datetime, report: SweepReport, *, source: str = "sweep") -> None:
    delivery = DeliveryTracker()
    cursor = None
    while True:
        with engine.begin() as conn:
            rows = [kind.to_eligible(r) for r in conn.execute(kind.eligible_page(
                now, cursor, settings.producer.sweep_page_size, without_ledger=True))]
            if not rows:
                return
            events = [expiry_event(kind.name, r.subject_id, r.tenant, r.due_at, source=source) for r in rows]
            created = set(insert_pending(conn, events, now))
        fresh = [e for e in events if e.op_key in created]
        emit_events(producer, codec, delivery, settings.topology.expiry, fresh, now)
        cursor = rows[-1].cursor
        report.pages += 1
        report.found += len(rows)
        report.emitted += len(fresh)
        report.by_kind[kind.name] = report.by_kind.get(kind.name, 0) + len(fresh)
        log.info("sweep page emitted", extra={"kind": kind.name, "emitted": len(fresh)})


def sweep_once(engine: Engine, producer: Producer, codec: Codec, settings: Settings,
               kinds: dict[str, CleanupKind],
               clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> SweepReport:
    """One full pass over every kind's due rows."""
    report = SweepReport()
    now = clock()
    for kind in kinds.values():
        sweep_kind(engine, producer, codec, settings, kind, now, report)
    return report
