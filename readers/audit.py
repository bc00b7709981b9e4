"""The audit: replay the retained history (expiry events, outcomes, dead letters) and check it.

The topics are read by manual assignment, with no group and no commits, each partition to its end:
partition EOF at or past the high watermark captured at the start (`partition_ends`), so the audit
is exact on Apache Kafka and on the embedded broker, whose ListOffsets answer can be short of the
end (PITFALLS.md). A partition that cannot be read to its end in time makes the audit refuse
(`EndNotReached`, naming it and how far it got); a partition whose offsets did not all yield a
record makes it incomplete — never "invariants hold". Records are joined by op key into small
per-key tuples (payloads are not kept), and a window with no records is "nothing to audit".
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from confluent_kafka import Consumer, Message

from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.ledger import APPLIED, SETTLED, TERMINAL, millis
from lapse.kernel.schema_names import CLEANUP_OUTCOME, DEAD_LETTER_RECORD, EXPIRY_EVENT
from lapse.kernel.settings import Settings
from lapse.readers.offsets import Span, manual_consumer, offsets_at, partitions_of, watermarks
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
STALL_S = 30.0  # a partition with no record and no end for this long is not read to its end


@dataclass
class AuditReport:
    """What the history shows; `broken` names every invariant that does not hold."""

    since: str | None = None
    until: str | None = None
    records: dict[str, int] = field(default_factory=dict)
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

    def __call__(self, _msg: Message | None = None) -> None:
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


def _plan_spans(consumer: Consumer, topic: str, since: datetime | None, report: AuditReport) -> list[Span]:
    parts = partitions_of(consumer, topic)
    marks = watermarks(consumer, topic, parts)
    hints = offsets_at(consumer, topic, parts, since) if since else {}
    spans = []
    for p in parts:
        low, high = marks[p]
        if since is None:
            start = low
            if low > 0:
                report.gaps.append({"topic": topic, "partition": p, "first_retained": low,
                                    "note": "retention deleted offsets before this one"})
        else:
            hint = hints[p]
            start = high if hint < 0 else max(hint, low)
        spans.append(Span(topic, p, start, high))
    return spans


def run_audit(settings: Settings, *, since: datetime | None = None, until: datetime | None = None,
              grace: timedelta = timedelta(minutes=5), now: datetime | None = None,
              progress: bool = True, stall_s: float = STALL_S) -> AuditReport:
    """Read the three topics to their ends and build the report. `since` None means from the
    beginning. Raises EndNotReached when a partition makes no progress for `stall_s` seconds
    before its end."""
    now = now or datetime.now(UTC)
    report = AuditReport(since=since.isoformat() if since else None,
                         until=until.isoformat() if until else None)
    codec = Codec.from_settings(settings)
    expected = {settings.topology.expiry: EXPIRY_EVENT, settings.topology.outcomes: CLEANUP_OUTCOME,
                settings.topology.dlq: DEAD_LETTER_RECORD}
    fields = {settings.topology.expiry: EVENT_FIELDS, settings.topology.outcomes: OUTCOME_FIELDS,
              settings.topology.dlq: DEAD_LETTER_FIELDS}
    history = _History()
    since_ms = millis(since) if since else None
    until_ms = millis(until) if until else None
    consumer = manual_consumer(settings)
    scanned: Counter[str] = Counter()
    try:
        spans = [s for topic in expected for s in _plan_spans(consumer, topic, since, report)]
        tracker = EndTracker(spans, time.monotonic())
        bar = Progress(sum(s.size for s in spans)) if progress else None
        records: Counter[str] = Counter()
        undecodable: Counter[str] = Counter()
        for msg in read_to_ends(consumer, spans, tracker, stall_s=stall_s, on_message=bar):
            topic, ts_ms = msg.topic(), msg.timestamp()[1]
            if topic is None:  # read_to_ends yields records only
                continue
            scanned[topic] += 1
            if (since_ms is not None and ts_ms < since_ms) or (until_ms is not None and ts_ms >= until_ms):
                continue
            records[topic] += 1
            try:
                record = codec.decode_fields(expected[topic], msg.value() or b"", fields[topic])
            except DecodeError:
                undecodable[topic] += 1
                continue
            if topic == settings.topology.expiry:
                history.event(record, ts_ms)
            elif topic == settings.topology.outcomes:
                history.outcome(record)
            else:
                history.dead_letter(record)
        if bar:
            bar.close()
    finally:
        consumer.close()
    report.records = {t: records[t] for t in expected}
    report.undecodable = {t: undecodable[t] for t in expected}
    report.in_range = {t: sum((p.end or p.position) - p.start for p in tracker.parts.values() if p.topic == t)
                       for t in expected}
    report.scanned = {t: scanned[t] for t in expected}
    report.unread = tracker.short()
    _summarise(history, report, cutoff_ms=millis(min(until or now, now) - grace))
    judge(report)
    return report


def judge(report: AuditReport) -> None:
    """Set `incomplete` and the verdict: broken invariants first; then whatever was not read (an
    audit that did not see everything cannot say the invariants hold); then an empty window."""
    held = sum(report.in_range.values())
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
