"""The archive of the ledger's transitions: one file per window of writing transactions
(`queries` says why transaction ids and not row ids), a window closing once per file span by the
database's clock. A window's manifest entry holds its transaction ids [first, last] and when it
closed; the next window starts where it ended, so the chain of entries has no gap and no overlap,
whoever wrote them.

A window reads the rows whose `at` is at most `lookback` older than the previous window's close:
a transaction that ran longer than that between reading its time and committing (Lapse's run for
seconds) would be missed, which the design page says.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine

from lapse.archive.files import TRANSITIONS, Spool
from lapse.archive.locations import transitions_stream
from lapse.archive.manifest import ManifestEntry, last_entry
from lapse.archive.queries import frontier, window_rows
from lapse.archive.segments import Segment, commit_segment
from lapse.archive.stores import ArchiveStore
from lapse.kernel.findings import ARCHIVE, TRANSITIONS_ARCHIVED, Finding, record_quietly
from lapse.kernel.ledger import millis
from lapse.kernel.logs import get_logger

log = get_logger("archive")
STREAM = transitions_stream()


@dataclass
class TransitionsArchive:
    """Where the transitions' archive stands (`position`: the next transaction id, 0 before the
    first window; `closed_ms`: when the last window closed, by the database's clock)."""

    store: ArchiveStore
    engine: Engine
    spool_dir: Path
    span_ms: int
    close_after_ms: int
    lookback: timedelta
    position: int = 0
    closed_ms: int | None = None
    loaded: bool = False

    def load(self) -> None:
        """Read where the chain ends from the manifest (once per ownership)."""
        last = last_entry(self.store, STREAM)
        self.position = last.end if last is not None else 0
        self.closed_ms = last.closed_ms if last is not None else None
        self.loaded = True

    def due(self, now_ms: int) -> bool:
        """Whether the span the last window closed in has ended `close_after` ago (at once before
        the first window)."""
        if self.closed_ms is None:
            return True
        bucket = self.closed_ms - self.closed_ms % self.span_ms
        return now_ms >= bucket + self.span_ms + self.close_after_ms

    def close_window(self) -> ManifestEntry | None:
        """Archive the next window; its entry (None when no transaction ended since the last one).
        When another writer's entry stands for this window, the position moves past it."""
        if not self.loaded:
            self.load()
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                bound = frontier(conn)
                if bound.xmin <= self.position:
                    self.closed_ms = millis(bound.now)
                    return None
                floor = (None if self.closed_ms is None
                         else datetime.fromtimestamp(self.closed_ms / 1000, UTC) - self.lookback)
                segment = Segment(Spool(TRANSITIONS, self.spool_dir, {"lapse.table": "lapse_transitions"}),
                                  self.position, 0)
                try:
                    for row in window_rows(conn, self.position, bound, floor):
                        segment.spool.append(row)
                        segment.took(row["id"], millis(row["at"]))
                except BaseException:
                    segment.spool.discard()
                    raise
        committed = commit_segment(self.store, STREAM, 0, segment, last=bound.xmin - 1, closed_ms=millis(bound.now))
        if not committed.ours:
            log.info("another archive process wrote this transitions window first",
                     extra={"first": segment.first})
            self.load()
            return None
        self.position, self.closed_ms = committed.entry.end, committed.entry.closed_ms
        closed = bound.now
        record_quietly(self.engine, Finding(ARCHIVE, TRANSITIONS_ARCHIVED, closed,
                                            f"transitions archived up to {closed.isoformat()}",
                                            {"archived_until": closed.isoformat(), "next_xid": self.position,
                                             "records": committed.entry.records}))
        return committed.entry
