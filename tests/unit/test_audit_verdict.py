"""The audit's verdict and its reading to the ends: "invariants hold" only when every partition was
read to its end (partition EOF at or past the high watermark captured at the start) and every
offset in between yielded a record; a partition that stalls before its end is given up and is a
gap; an empty window is "nothing to audit" — never a success claimed over records that were not
seen (PITFALLS.md: an audit on tansu once read 421 of 452 events and reported success)."""

from __future__ import annotations

from lapse.readers.audit import BROKEN, HOLD, INCOMPLETE, NOTHING, AuditReport, judge
from lapse.readers.offsets import Span
from lapse.readers.partition_ends import EndTracker

SPANS = [Span("t.expiry", 0, 0, 10), Span("t.expiry", 1, 5, 5), Span("t.outcomes", 0, 2, 4)]


def _read(tracker: EndTracker, topic: str, partition: int, offsets: range, eof: int | None, now: float = 1.0) -> None:
    for offset in offsets:
        tracker.record(topic, partition, offset, now)
    if eof is not None:
        tracker.eof(topic, partition, eof, now)


def _report(tracker: EndTracker, records: int, broken: list[str] | None = None) -> AuditReport:
    parts = tracker.parts.values()
    report = AuditReport(records={"t.expiry": records, "t.outcomes": 0}, broken=broken or [],
                         in_range={t: sum((p.end or p.position) - p.start for p in parts if p.topic == t)
                                   for t in ("t.expiry", "t.outcomes")},
                         scanned={t: sum(p.records for p in parts if p.topic == t) for t in ("t.expiry", "t.outcomes")})
    report.unread = tracker.short()
    judge(report)
    return report


def test_every_partition_read_to_its_end_holds():
    tracker = EndTracker(SPANS, 0.0)
    _read(tracker, "t.expiry", 0, range(0, 10), eof=10)
    _read(tracker, "t.expiry", 1, range(0), eof=5)
    _read(tracker, "t.outcomes", 0, range(2, 4), eof=4)
    report = _report(tracker, records=10)
    assert tracker.pending == []
    assert (report.verdict, report.unread, report.incomplete) == (HOLD, [], [])


def test_records_past_a_short_high_watermark_are_read_to_partition_eof():
    """The embedded broker's ListOffsets can answer short of the end: EOF decides, not the mark."""
    tracker = EndTracker([Span("t.expiry", 0, 0, 7)], 0.0)
    _read(tracker, "t.expiry", 0, range(0, 7), eof=None)
    assert [p.partition for p in tracker.pending] == [0]  # at the captured mark, but no EOF yet
    _read(tracker, "t.expiry", 0, range(7, 10), eof=10)
    assert tracker.pending == [] and tracker.parts[("t.expiry", 0)].records == 10


def test_an_eof_short_of_the_captured_high_watermark_is_not_the_end():
    tracker = EndTracker([Span("t.expiry", 0, 0, 10)], 0.0)
    _read(tracker, "t.expiry", 0, range(0, 6), eof=6, now=1.0)
    assert [p.position for p in tracker.pending] == [6]
    assert tracker.give_up_stalled(now=5.0, stall_s=5.0) == []  # it moved at 1.0
    (stalled,) = tracker.give_up_stalled(now=6.0, stall_s=5.0)
    assert (stalled.position, stalled.captured, stalled.stalled) == (6, 10, True)
    assert tracker.pending == [] and tracker.given_up() == [stalled]
    assert not tracker.record("t.expiry", 0, 6, now=7.0)  # given up: a late record is not counted


def test_offsets_that_yielded_no_record_make_the_audit_incomplete():
    tracker = EndTracker(SPANS, 0.0)
    _read(tracker, "t.expiry", 0, range(0, 7), eof=10)  # EOF at 10 after offset 6: three never came
    _read(tracker, "t.expiry", 1, range(0), eof=5)
    _read(tracker, "t.outcomes", 0, range(2, 4), eof=4)
    report = _report(tracker, records=7)
    assert report.verdict == INCOMPLETE
    assert report.incomplete == ["3 of 12 records in range not read, from 1 partition",
                                 "t.expiry[0] read to offset 7 of 10"]


def test_broken_wins_and_an_empty_window_is_nothing_to_audit():
    tracker = EndTracker(SPANS, 0.0)
    _read(tracker, "t.expiry", 0, range(0), eof=10)
    assert _report(tracker, records=0, broken=["1 op keys applied more than once"]).verdict == BROKEN
    assert _report(tracker, records=0).incomplete[0] == "read nothing although the topics hold 10 records in range"
    empty = EndTracker([Span("t.expiry", 0, 3, 3)], 0.0)
    _read(empty, "t.expiry", 0, range(0), eof=3)
    report = AuditReport(records={"t.expiry": 0}, in_range={"t.expiry": 0}, scanned={"t.expiry": 0})
    report.unread = empty.short()
    judge(report)
    assert (report.verdict, report.incomplete) == (NOTHING, [])


def test_gaps_make_the_audit_incomplete_unless_allowed():
    gap = {"topic": "t.expiry", "partition": 2, "first_offset": 0, "end_offset": 9, "records": 9,
           "reason": "no longer on the topic (retention); no archive was given", "first_time": None,
           "after_time": None, "before_time": "2026-12-06T10:00:00.000Z"}
    failing = AuditReport(records={"t.expiry": 21}, in_range={"t.expiry": 21}, scanned={"t.expiry": 21}, gaps=[gap])
    judge(failing)
    assert failing.verdict == INCOMPLETE
    assert failing.incomplete == [
        "9 offsets in the window could not be read, in 1 partition (--allow-gaps accepts that)",
        "t.expiry[2] offsets 0-8 (9) not read: no longer on the topic (retention); no archive was given; "
        "before 2026-12-06T10:00:00.000Z"]
    allowed = AuditReport(records={"t.expiry": 21}, in_range={"t.expiry": 21}, scanned={"t.expiry": 21},
                          gaps=[gap], gaps_allowed=True)
    judge(allowed)
    assert (allowed.verdict, allowed.incomplete, allowed.gaps) == (HOLD, [], [gap])
