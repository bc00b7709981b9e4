"""What an audit could not read: the gaps in the history it was asked for, per partition.

A partition's history is read from pieces in offset order: the archive's files for offsets the
topic no longer holds (when an archive is given), then the offsets the topic retains. Offsets no
piece holds — deleted by retention before anyone archived them — are a gap when they may hold
records of the window; so are an archive file that is missing or altered and a partition that
stalled before its end. With `--since`, a hole is outside the window when the first record after
it is older than `since`: a partition's records are in time order (Lapse produces with the time
of sending), so everything before that record is older too. A hole whose next record is unknown
(nothing retained after it) may hold records of any time and is a gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lapse.archive import ManifestEntry

NOT_RETAINED = "no longer on the topic (retention) and not in the archive"
NOT_RETAINED_NO_ARCHIVE = "no longer on the topic (retention); no archive was given"
STALLED = "the broker delivered neither a record nor the end for the read timeout"


@dataclass(frozen=True)
class Window:
    """[since, until) in epoch ms; None: unbounded."""

    since_ms: int | None
    until_ms: int | None

    def holds(self, ms: int) -> bool:
        return (self.since_ms is None or ms >= self.since_ms) and (self.until_ms is None or ms < self.until_ms)

    def may_hold_between(self, after_ms: int | None, before_ms: int | None) -> bool:
        """Whether records between one read at `after_ms` and one read at `before_ms` (None: no
        such record) may fall in the window."""
        if self.since_ms is not None and before_ms is not None and before_ms < self.since_ms:
            return False
        return not (self.until_ms is not None and after_ms is not None and after_ms >= self.until_ms)

    def may_hold(self, entry: ManifestEntry) -> bool:
        """Whether an archived file may hold records of the window (by its earliest and latest times)."""
        if self.since_ms is not None and entry.max_ms is not None and entry.max_ms < self.since_ms:
            return False
        return not (self.until_ms is not None and entry.min_ms is not None and entry.min_ms >= self.until_ms)


@dataclass(frozen=True)
class Piece:
    """Offsets [first, end) of a partition one source holds; the times (epoch ms) of its first
    and last record, None when not known."""

    first: int
    end: int
    first_ms: int | None
    last_ms: int | None


@dataclass(frozen=True)
class Gap:
    """Offsets [first_offset, end_offset) of a partition the audit could not read, and why; the
    time of the first of them when known (an archive file's manifest says it), else the times of
    the records read just before and just after."""

    topic: str
    partition: int
    first_offset: int
    end_offset: int
    reason: str
    first_ms: int | None = None
    after_ms: int | None = None
    before_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "first_offset": self.first_offset,
                "end_offset": self.end_offset, "records": self.end_offset - self.first_offset,
                "reason": self.reason, "first_time": _iso(self.first_ms), "after_time": _iso(self.after_ms),
                "before_time": _iso(self.before_ms)}


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def holes(topic: str, partition: int, pieces: list[Piece], window: Window, reason: str) -> list[Gap]:
    """The offsets before and between `pieces` (in offset order, from offset 0) that no piece
    holds and that may hold records of the window."""
    gaps, at, after = [], 0, None
    for piece in pieces:
        if piece.first > at and window.may_hold_between(after, piece.first_ms):
            gaps.append(Gap(topic, partition, at, piece.first, reason, after_ms=after, before_ms=piece.first_ms))
        if piece.end > at:
            at, after = piece.end, piece.last_ms if piece.last_ms is not None else after
    return gaps


def gap_line(gap: dict[str, Any]) -> str:
    """One gap as a person reads it: where, how many offsets, why, and when."""
    span = (f"offset {gap['first_offset']}" if gap["records"] == 1
            else f"offsets {gap['first_offset']}-{gap['end_offset'] - 1} ({gap['records']})")
    if gap["first_time"]:
        when = f"; the first at {gap['first_time']}"
    else:
        bounds = [f"after {gap['after_time']}" if gap["after_time"] else "",
                  f"before {gap['before_time']}" if gap["before_time"] else ""]
        when = "; " + " and ".join(b for b in bounds if b) if any(bounds) else "; time unknown"
    return f"{gap['topic']}[{gap['partition']}] {span} not read: {gap['reason']}{when}"
