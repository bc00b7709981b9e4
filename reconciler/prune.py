"""The prune pass: remove what retention no longer keeps, in bounded batches, each its own short
transaction, so the hot path never waits long behind it and a stop takes effect between batches.

Order matters for transitions: a transition goes once its ledger row is gone, so ledger rows are
removed first (applied and skipped, then dead letters), then the transitions they leave behind,
then sent outbox rows. A dry run counts the same rows and changes nothing. The horizons and why
they are what they are come from `lapse.reconciler.horizons`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine

from lapse.kernel.ledger import count_prunable, prune_dead_letters, prune_outbox, prune_settled, prune_transitions
from lapse.kernel.logs import get_logger
from lapse.reconciler.horizons import Horizons

log = get_logger("prune")

TABLES = ("ledger_settled", "ledger_dead_letters", "transitions", "outbox")
# Progress: called after every batch with (table, rows removed from it so far in this pass).
Progress = Callable[[str, int], None]


@dataclass
class PruneReport:
    """What a pass removed (or, dry, would remove) per table, in how many batches, and the horizon
    and cutoff of each."""

    dry_run: bool
    at: datetime
    horizons: Horizons
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    batches: int = 0
    stopped: bool = False

    def to_dict(self) -> dict[str, Any]:
        horizons = self.horizons.to_dict()
        cutoffs = _cutoffs(self.horizons, self.at)
        return {
            "dry_run": self.dry_run,
            "at": self.at.isoformat(),
            "tables": {t: {("would_remove" if self.dry_run else "removed"): self.removed[t],
                           "horizon_s": horizons[t]["seconds"], "reason": horizons[t]["reason"],
                           "cutoff": None if cutoffs[t] is None else cutoffs[t].isoformat()}  # type: ignore[union-attr]
                       for t in TABLES},
            "total": sum(self.removed.values()),
            "batches": self.batches,
            "stopped": self.stopped,
        }


def _cutoffs(horizons: Horizons, now: datetime) -> dict[str, datetime | None]:
    return {"ledger_settled": horizons.settled.cutoff(now),
            "ledger_dead_letters": horizons.dead_letters.cutoff(now),
            "transitions": horizons.transitions.cutoff(now),
            "outbox": horizons.outbox.cutoff(now)}


def prune_dry_run(engine: Engine, horizons: Horizons, now: datetime) -> PruneReport:
    """Count per table what `prune_once` would remove at `now`; nothing is changed."""
    cutoffs = _cutoffs(horizons, now)
    outbox_cutoff = cutoffs["outbox"]
    assert outbox_cutoff is not None  # the outbox horizon is always finite
    with engine.connect() as conn:
        counts = count_prunable(conn, settled_cutoff=cutoffs["ledger_settled"],
                                dead_letter_cutoff=cutoffs["ledger_dead_letters"],
                                transitions_cutoff=cutoffs["transitions"], outbox_cutoff=outbox_cutoff)
    return PruneReport(True, now, horizons, counts)


def prune_once(engine: Engine, horizons: Horizons, now: datetime, batch_size: int, *,
               stop: threading.Event | None = None, progress: Progress | None = None) -> PruneReport:
    """Remove, batch by batch, every row older than its horizon at `now`; returns what was removed.
    Stops between batches once `stop` is set (the report says so)."""
    report = PruneReport(False, now, horizons)
    cutoffs = _cutoffs(horizons, now)
    after: list[datetime | None] = [None]

    def transitions(conn: Connection, cutoff: datetime) -> int:
        n, after[0] = prune_transitions(conn, cutoff, after[0], batch_size)
        return n

    steps: list[tuple[str, Callable[[Connection, datetime], int]]] = [
        ("ledger_settled", lambda conn, cutoff: prune_settled(conn, cutoff, batch_size)),
        ("ledger_dead_letters", lambda conn, cutoff: prune_dead_letters(conn, cutoff, batch_size)),
        ("transitions", transitions),
        ("outbox", lambda conn, cutoff: prune_outbox(conn, cutoff, batch_size)),
    ]
    for table, step in steps:
        cutoff = cutoffs[table]
        if cutoff is None:
            continue
        while True:
            if stop is not None and stop.is_set():
                report.stopped = True
                return report
            with engine.begin() as conn:
                n = step(conn, cutoff)
            report.batches += 1
            report.removed[table] += n
            if progress is not None:
                progress(table, report.removed[table])
            if n < batch_size:
                break
    log.info("prune pass removed %d rows in %d batches", sum(report.removed.values()), report.batches,
             extra={"removed": report.removed})
    return report
