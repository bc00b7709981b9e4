"""The audit: replay the history (expiry events, outcomes, dead letters) and check it.

The topics are read by manual assignment, with no group and no commits, each partition to its end:
partition EOF at or past the high watermark captured at the start (`partition_ends`), so the audit
is exact on Apache Kafka and on the embedded broker, whose ListOffsets answer can be short of the
end (PITFALLS.md). With an archive, the offsets a topic no longer holds are read from the archive's
files first, so archive and topic are one history. Whatever part of the window could not be read —
offsets retention deleted before they were archived, an archive file missing or altered, a
partition that stalled before its end — is a gap (`coverage`), named per partition with its first
offset and time, and makes the audit incomplete unless gaps are allowed; a partition whose offsets
did not all yield a record makes it incomplete too — never "invariants hold" over what was not
read. Records are joined by op key into small per-key tuples (payloads are not kept), and a window
with no records is "nothing to audit". Whether an event waited past the grace is judged against
the database's now, which the caller's clock gives once the history was read.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, TextIO

from confluent_kafka import Consumer

from lapse.archive import ArchiveReader, FileDamaged, ManifestEntry
from lapse.kernel.clock import Clock
from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.ledger import APPLIED, SETTLED, TERMINAL, millis
from lapse.kernel.schema_names import CLEANUP_OUTCOME, DEAD_LETTER_RECORD, EXPIRY_EVENT
from lapse.kernel.settings import Settings
from lapse.readers.coverage import (
    NOT_RETAINED,
    NOT_RETAINED_NO_ARCHIVE,
    STALLED,
    Gap,
    Piece,
    Window,
    gap_line,
    holes,
)
from lapse.readers.offsets import Span, manual_consumer, starts
from lapse.readers.partition_ends import EndTracker, read_to_ends

SAMPLE = 20  # op keys listed per finding; counts are always complete
HOLD = "invariants hold"
BROKEN = "broken"
INCOMPLETE = "incomplete"
NOTHING = "nothing to audit"
# The only fields the audit reads: the rest of each record is skipped, not decoded.
EVENT_FIELDS = ("op_key", "replay_id")
OUTCOME_FIELDS = ("outcome_id", "op_key", "status", "occurred_at", "replay_id")
DEAD_LETTER_FIELDS = ("op_key", "dead_lettered_at")
STALL_S = 30.0  # a partition with no record and no end for this long is given up: a gap


@dataclass
class AuditReport:
    """What the history shows; `broken` names every invariant that does not hold."""

    since: str | None = None
    until: str | None = None
    at: str | None = None                                        # the database's now the grace was judged at
    archive: str | None = None                                   # the archive read with the topics
    records: dict[str, int] = field(default_factory=dict)
    archived: dict[str, int] = field(default_factory=dict)       # of them, read from the archive
    undecodable: dict[str, int] = field(default_factory=dict)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    events_seen: int = 0
    op_keys_seen: int = 0
    outcomes: int = 0
    outcome_repeats: int = 0
    outcomes_by_status: dict[str, int] = field(default_factory=dict)
    final_by_status: dict[str, int] = field(default_factory=dict)
    without_terminal: int = 0
    without_terminal_sample: list[str] = field(default_factory=list)
    applied_twice: dict[str, list[int]] = field(default_factory=dict)
    dead_letters: int = 0
    poison_dead_letters: int = 0
    unresolved_dead_letters: int = 0
    unresolved_sample: list[str] = field(default_factory=list)
    replays: dict[str, dict[str, int]] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)
    in_range: dict[str, int] = field(default_factory=dict)      # offsets from each start to the end reached
    scanned: dict[str, int] = field(default_factory=dict)       # records read from them (before --since/--until)
    unread: list[dict[str, Any]] = field(default_factory=list)  # partitions whose offsets did not all yield a record
    gaps_allowed: bool = False                                   # --allow-gaps: gaps are named, not failed on
    incomplete: list[str] = field(default_factory=list)
    verdict: str = NOTHING

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Progress:
    """A one-line progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.done, self.last = max(total, 1), 0, 0.0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()

    def __call__(self, _msg: object = None) -> None:
        self.done += 1
        if self.enabled and (time.monotonic() - self.last > 0.2 or self.done >= self.total):
            self.last = time.monotonic()
            share = min(1.0, self.done / self.total)
            bar = "#" * int(share * 30)
            self.stream.write(f"\raudit [{bar:<30}] {share:4.0%} {self.done}/{self.total} records")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")


class _History:
    """The per-op-key joins, as small tuples of ints and strings."""

    def __init__(self) -> None:
        self.event_first_ms: dict[str, int] = {}
        self.events = 0
        self.outcome_ids: set[int] = set()
        self.repeats = 0
        self.by_status: Counter[str] = Counter()
        self.final: dict[str, tuple[int, int, str]] = {}   # op key → (occurred ms, outcome id, status)
        self.applied: dict[str, list[int]] = {}
        self.resolved_ms: dict[str, int] = {}               # latest applied/skipped outcome time
        self.dead_ms: dict[str, int] = {}                   # latest dead letter time
        self.dead_letters = 0
        self.poison = 0
        self.replays: dict[str, Counter[str]] = {}

    def event(self, record: dict[str, Any], ts_ms: int) -> None:
        self.events += 1
        key = record["op_key"]
        self.event_first_ms[key] = min(ts_ms, self.event_first_ms.get(key, ts_ms))
        if record.get("replay_id"):
            self.replays.setdefault(record["replay_id"], Counter())["events"] += 1

    def outcome(self, record: dict[str, Any]) -> None:
        oid = record["outcome_id"]
        if oid in self.outcome_ids:
            self.repeats += 1  # the relay's at-least-once repeat of one outbox row
            return
        self.outcome_ids.add(oid)
        key, status, at = record["op_key"], record["status"], millis(record["occurred_at"])
        self.by_status[status] += 1
        if record.get("replay_id"):
            self.replays.setdefault(record["replay_id"], Counter())[f"outcome:{status}"] += 1
        if status not in TERMINAL:
            return
        if self.final.get(key, (-1, -1, ""))[:2] < (at, oid):
            self.final[key] = (at, oid, status)
        if status == APPLIED:
            self.applied.setdefault(key, []).append(oid)
        if status in SETTLED:
            self.resolved_ms[key] = max(at, self.resolved_ms.get(key, at))

    def dead_letter(self, record: dict[str, Any]) -> None:
        self.dead_letters += 1
        key = record.get("op_key")
        if key is None:
            self.poison += 1  # undecodable input: only an operator can resolve it
            return
        at = millis(record["dead_lettered_at"])
        self.dead_ms[key] = max(at, self.dead_ms.get(key, at))


@dataclass
class _Partition:
    """How one partition is read: the topic from `start` (its retained offsets are [low, high)),
    and before it the archive's entries holding offsets below `low`."""

    topic: str
    partition: int
    low: int
    high: int
    start: int
    archived: list[ManifestEntry]


def _plan(consumer: Consumer, topic: str, since: datetime | None, archive: ArchiveReader | None) -> list[_Partition]:
    return [_Partition(topic, s.partition, s.low, s.high, s.start,
                       archive.topic_entries(topic, s.partition, below=s.low) if archive else [])
            for s in starts(consumer, topic, since)]


def _from_archive(archive: ArchiveReader, plan: list[_Partition], window: Window,
                  gaps: list[Gap]) -> Iterator[tuple[str, int, bytes]]:
    """(topic, timestamp, value) of every archived record below each partition's retained offsets
    that the window may hold; a damaged file is a gap (its records are never given)."""
    for part in plan:
        position = 0
        for entry in part.archived:
            end = min(entry.end, part.low)
            if not window.may_hold(entry) or end <= position:
                continue
            try:
                for record in archive.records(part.topic, entry):
                    if position <= record.offset < end:  # overlapping files are read once
                        position = record.offset + 1
                        yield part.topic, record.timestamp_ms, record.value or b""
            except FileDamaged as exc:
                gaps.append(Gap(part.topic, part.partition, entry.first, end, str(exc), first_ms=entry.first_ms))
            position = max(position, end)


def _gaps(plan: list[_Partition], tracker: EndTracker, window: Window, archive: ArchiveReader | None,
          stall_s: float) -> list[Gap]:
    """The holes before and between each partition's pieces, and its stall, if it stalled."""
    found = []
    for part in plan:
        read = tracker.parts[(part.topic, part.partition)]
        pieces = [Piece(e.first, min(e.end, part.low), e.first_ms, e.last_ms) for e in part.archived]
        # Read from past the retained head, Kafka answered that the head is older than `since`.
        head_ms = read.first_ms if part.start == part.low else (window.since_ms or 0) - 1
        pieces.append(Piece(part.low, read.end or read.position, head_ms, read.last_ms))
        found += holes(part.topic, part.partition, pieces, window, NOT_RETAINED if archive else NOT_RETAINED_NO_ARCHIVE)
        if read.stalled:
            found.append(Gap(part.topic, part.partition, read.position, max(read.captured, read.position + 1),
                             f"{STALLED} ({stall_s:g}s)", after_ms=read.last_ms))
    return found


def run_audit(settings: Settings, *, clock: Clock, since: datetime | None = None, until: datetime | None = None,
              grace: timedelta = timedelta(minutes=5), progress: bool = True, stall_s: float = STALL_S,
              archive: ArchiveReader | None = None, allow_gaps: bool = False) -> AuditReport:
    """Read the three topics to their ends (with `archive`, its files first, for what the topics no
    longer hold) and build the report. `since` None means from the beginning; `clock` gives the
    database's now once everything was read, against which the grace is judged. A partition that
    makes no progress for `stall_s` seconds before its end is a gap."""
    report = AuditReport(since=since.isoformat() if since else None, until=until.isoformat() if until else None,
                         archive=archive.url if archive else None, gaps_allowed=allow_gaps)
    codec = Codec.from_settings(settings)
    expected = {settings.topology.expiry: EXPIRY_EVENT, settings.topology.outcomes: CLEANUP_OUTCOME,
                settings.topology.dlq: DEAD_LETTER_RECORD}
    fields = {settings.topology.expiry: EVENT_FIELDS, settings.topology.outcomes: OUTCOME_FIELDS,
              settings.topology.dlq: DEAD_LETTER_FIELDS}
    history = _History()
    window = Window(millis(since) if since else None, millis(until) if until else None)
    records: Counter[str] = Counter()
    undecodable: Counter[str] = Counter()

    def take(topic: str, ts_ms: int, value: bytes) -> bool:
        if not window.holds(ts_ms):
            return False
        records[topic] += 1
        try:
            record = codec.decode_fields(expected[topic], value, fields[topic])
        except DecodeError:
            undecodable[topic] += 1
            return True
        if topic == settings.topology.expiry:
            history.event(record, ts_ms)
        elif topic == settings.topology.outcomes:
            history.outcome(record)
        else:
            history.dead_letter(record)
        return True

    consumer = manual_consumer(settings)
    scanned: Counter[str] = Counter()
    archived: Counter[str] = Counter()
    gaps: list[Gap] = []
    try:
        plan = [part for topic in expected for part in _plan(consumer, topic, since, archive)]
        spans = [Span(part.topic, part.partition, part.start, part.high) for part in plan]
        tracker = EndTracker(spans, time.monotonic())
        bar = Progress(sum(s.size for s in spans) + sum(e.records for part in plan for e in part.archived)
                       ) if progress else None
        if archive is not None:
            for topic, ts_ms, value in _from_archive(archive, plan, window, gaps):
                if bar:
                    bar()
                archived[topic] += take(topic, ts_ms, value)
        for msg in read_to_ends(consumer, spans, tracker, stall_s=stall_s, on_message=bar):
            read_from = msg.topic()
            if read_from is None:  # read_to_ends yields records only
                continue
            scanned[read_from] += 1
            take(read_from, msg.timestamp()[1], msg.value() or b"")
        if bar:
            bar.close()
    finally:
        consumer.close()
    gaps += _gaps(plan, tracker, window, archive, stall_s)
    now = clock()
    report.at = now.isoformat()
    report.records = {t: records[t] for t in expected}
    report.archived = {t: archived[t] for t in expected}
    report.undecodable = {t: undecodable[t] for t in expected}
    report.in_range = {t: sum((p.end or p.position) - p.start for p in tracker.parts.values() if p.topic == t)
                       for t in expected}
    report.scanned = {t: scanned[t] for t in expected}
    report.unread = tracker.short()
    report.gaps = [g.to_dict() for g in sorted(gaps, key=lambda g: (g.topic, g.partition, g.first_offset))]
    _summarise(history, report, cutoff_ms=millis(min(until or now, now) - grace))
    judge(report)
    return report


def judge(report: AuditReport) -> None:
    """Set `incomplete` and the verdict: broken invariants first; then whatever was not read (an
    audit that did not see everything cannot say the invariants hold; gaps only unless allowed);
    then an empty window."""
    held = sum(report.in_range.values())
    if report.gaps and not report.gaps_allowed:
        missing = sum(g["records"] for g in report.gaps)
        parts = len({(g["topic"], g["partition"]) for g in report.gaps})
        report.incomplete.append(f"{missing} offsets in the window could not be read, in {parts} "
                                 f"partition{'' if parts == 1 else 's'} (--allow-gaps accepts that)")
        report.incomplete += [gap_line(g) for g in report.gaps[:SAMPLE]]
    if report.unread:
        missing = sum(u["missing"] for u in report.unread)
        if not sum(report.scanned.values()):
            report.incomplete.append(f"read nothing although the topics hold {held} records in range")
        else:
            parts = len(report.unread)
            report.incomplete.append(f"{missing} of {held} records in range not read, from {parts} "
                                     f"partition{'' if parts == 1 else 's'}")
        report.incomplete += [f"{u['topic']}[{u['partition']}] read to offset {u['read_to']} of {u['end']}"
                              for u in report.unread[:SAMPLE]]
    if report.broken:
        report.verdict = BROKEN
    elif report.incomplete:
        report.verdict = INCOMPLETE
    elif not sum(report.records.values()):
        report.verdict = NOTHING
    else:
        report.verdict = HOLD


def _summarise(h: _History, report: AuditReport, cutoff_ms: int) -> None:
    report.events_seen = h.events
    report.op_keys_seen = len(h.event_first_ms)
    report.outcomes = len(h.outcome_ids)
    report.outcome_repeats = h.repeats
    report.outcomes_by_status = dict(sorted(h.by_status.items()))
    report.final_by_status = dict(sorted(Counter(s for _, _, s in h.final.values()).items()))
    missing = sorted(k for k, t in h.event_first_ms.items() if k not in h.final and t <= cutoff_ms)
    report.without_terminal = len(missing)
    report.without_terminal_sample = missing[:SAMPLE]
    report.applied_twice = {k: sorted(ids) for k, ids in sorted(h.applied.items()) if len(ids) > 1}
    report.dead_letters = h.dead_letters
    report.poison_dead_letters = h.poison
    unresolved = sorted(k for k, at in h.dead_ms.items() if h.resolved_ms.get(k, -1) < at)
    report.unresolved_dead_letters = len(unresolved) + h.poison
    report.unresolved_sample = unresolved[:SAMPLE]
    report.replays = {rid: dict(sorted(c.items())) for rid, c in sorted(h.replays.items())}
    if report.applied_twice:
        report.broken.append(f"{len(report.applied_twice)} op keys applied more than once")
    if missing:
        report.broken.append(f"{len(missing)} events without a terminal outcome after the grace period")
