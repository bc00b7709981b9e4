"""The audit's verdict: "invariants hold" only when everything the topics hold in the window was
read; a partition not read to its end makes the audit incomplete (exit 1), and an empty window is
"nothing to audit" — never a success claimed over records that were not seen (PITFALLS.md: tansu
once handed a consumer no partitions and an audit of 421 of 452 events reported success)."""

from __future__ import annotations

from lapse.readers.audit import BROKEN, HOLD, INCOMPLETE, NOTHING, AuditReport, judge, unread_spans
from lapse.readers.offsets import Span

SPANS = [Span("t.expiry", 0, 0, 10), Span("t.expiry", 1, 5, 5), Span("t.outcomes", 0, 2, 4)]


def _report(read_to: dict[tuple[str, int], int], records: int, broken: list[str] | None = None) -> AuditReport:
    report = AuditReport(records={"t.expiry": records, "t.outcomes": 0}, broken=broken or [],
                         in_range={"t.expiry": 10, "t.outcomes": 2},
                         scanned={"t.expiry": read_to.get(("t.expiry", 0), 0), "t.outcomes": 0})
    report.unread = unread_spans(SPANS, read_to)
    judge(report)
    return report


def test_everything_read_and_nothing_broken_holds():
    report = _report({("t.expiry", 0): 10, ("t.outcomes", 0): 4}, records=10)
    assert (report.verdict, report.unread, report.incomplete) == (HOLD, [], [])


def test_reading_nothing_of_what_the_topics_hold_is_incomplete():
    report = _report({}, records=0)
    assert report.verdict == INCOMPLETE
    assert report.incomplete[0] == "read nothing although the topics hold 12 records in range"
    assert [(u["topic"], u["partition"], u["read_to"], u["end"]) for u in report.unread] == [
        ("t.expiry", 0, 0, 10), ("t.outcomes", 0, 2, 4)]


def test_a_partition_read_short_of_its_end_is_incomplete():
    report = _report({("t.expiry", 0): 7, ("t.outcomes", 0): 4}, records=7)
    assert report.verdict == INCOMPLETE
    assert report.incomplete == ["3 of 12 records in range not read, from 1 partition",
                                 "t.expiry[0] read to offset 7 of 10"]


def test_broken_wins_and_an_empty_window_is_nothing_to_audit():
    assert _report({}, records=0, broken=["1 op keys applied more than once"]).verdict == BROKEN
    empty = AuditReport(records={"t.expiry": 0}, in_range={"t.expiry": 0}, scanned={"t.expiry": 0})
    empty.unread = unread_spans([Span("t.expiry", 0, 3, 3)], {})
    judge(empty)
    assert (empty.verdict, empty.incomplete) == (NOTHING, [])
