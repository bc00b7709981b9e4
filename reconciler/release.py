"""Release parked work once its brake is off: held rows no pause covers any more (and whose kind is
declared), shadowed rows of a kind that is live now. Each goes back to pending, due now, attempt
unchanged, with its expiry event through the outbox (the relay publishes it), a page per
transaction. A resume releases at once; every reconciler pass releases what is left (a kind
declared again, a shadow switched to live, a resume cut short).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import Engine

from lapse.kernel.clock import Clock, now_in
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import PENDING, LedgerWrites, event_for_row, release_parked
from lapse.kernel.logs import get_logger
from lapse.kernel.topology import Topology
from lapse.reconciler.queries import releasable

log = get_logger("release")
SOURCE = ACTOR = "release"
PAGE = 1000


@dataclass
class ReleaseReport:
    """Parked operations released, per kind, in how many pages."""

    released: int = 0
    pages: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"released": self.released, "pages": self.pages, "by_kind": dict(sorted(self.by_kind.items()))}


def release_parked_work(engine: Engine, kinds: Mapping[str, CleanupKind], topology: Topology, *,
                        clock: Clock | None = None, page_size: int = PAGE, stop: threading.Event | None = None,
                        progress: Callable[[int], None] | None = None) -> ReleaseReport:
    """Release every parked row whose brake is off, `page_size` a transaction, until a page finds
    none (another release may be taking some at the same time: rows it holds are skipped, not
    waited for), or `stop` is set; `progress` is told how many each page released."""
    declared = sorted(kinds)
    live = sorted(name for name, kind in kinds.items() if not kind.shadow)
    clause = releasable(declared, live)
    report = ReleaseReport()
    while stop is None or not stop.is_set():
        with engine.begin() as conn:
            now = now_in(conn, clock)
            moved = release_parked(conn, clause, page_size, now)
            writes = LedgerWrites(ACTOR, now)
            for prior, row in moved:
                writes.transition(row.op_key, prior, PENDING, row.attempt, reason=f"released from {prior}",
                                  replay_id=row.replay_id, correlation_id=row.correlation_id)
                writes.expiry(topology.expiry, event_for_row(row, source=SOURCE))
                report.by_kind[row.kind] = report.by_kind.get(row.kind, 0) + 1
            writes.flush(conn)
        if not moved:
            break
        report.pages += 1
        report.released += len(moved)
        if progress is not None:
            progress(len(moved))
    if report.released:
        log.info("parked operations released", extra=report.to_dict())
    return report
