"""The gaps an audit names: offsets before and between the pieces it could read (archived files, the
retained topic) that may hold records of the window. A hole is outside a `--since` window only when
the first record read after it is older than `since` (a partition's records are in time order), and
outside an `--until` window when the record read before it is at or after `until`."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from lapse.readers.coverage import Gap, Piece, Window, holes


def _pieces(bounds: list[int], first_ms: list[int]) -> list[Piece]:
    """Pieces [b0, b1), [b2, b3), … with their first records at the given times."""
    pairs = list(zip(bounds[::2], bounds[1::2], strict=True))
    return [Piece(a, b, t, t + (b - a)) for (a, b), t in zip(pairs, first_ms, strict=True)]


@st.composite
def partitions(draw: st.DrawFn) -> list[Piece]:
    bounds = sorted(draw(st.lists(st.integers(0, 10_000), min_size=2, max_size=12, unique=True)))
    bounds = bounds[: len(bounds) // 2 * 2]
    times = sorted(draw(st.lists(st.integers(0, 10**9), min_size=len(bounds) // 2, max_size=len(bounds) // 2)))
    return _pieces(bounds, times)


@given(partitions())
def test_from_the_beginning_pieces_and_gaps_cover_every_offset_once(pieces):
    gaps = holes("t", 0, pieces, Window(None, None), "r")
    covered = sorted([(p.first, p.end) for p in pieces] + [(g.first_offset, g.end_offset) for g in gaps])
    assert covered[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # no overlap, no hole
    assert all(g.first_offset < g.end_offset for g in gaps)


@given(partitions(), st.integers(0, 10**9))
def test_with_since_a_hole_is_a_gap_exactly_when_the_record_after_it_is_not_older(pieces, since_ms):
    gaps = {(g.first_offset, g.end_offset) for g in holes("t", 0, pieces, Window(since_ms, None), "r")}
    every = holes("t", 0, pieces, Window(None, None), "r")
    assert gaps == {(g.first_offset, g.end_offset) for g in every if g.before_ms >= since_ms}


def test_a_trimmed_head_names_its_first_offset_and_the_time_of_the_first_record_kept():
    (gap,) = holes("t.expiry", 1, [Piece(9, 30, 1_000, 2_000)], Window(None, None), "retention")
    assert gap == Gap("t.expiry", 1, 0, 9, "retention", None, None, 1_000)
    assert gap.to_dict()["before_time"] == "1970-01-01T00:00:01.000Z"
    # Nothing retained after it: the hole may hold records of any time.
    assert holes("t", 0, [Piece(5, 5, None, None)], Window(10**12, None), "r") != []
    # --until before the hole: the record before it is at or after --until.
    assert holes("t", 0, [Piece(0, 3, 0, 50), Piece(5, 9, 60, 70)], Window(None, 40), "r") == []
