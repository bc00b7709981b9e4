"""The http effect's URL from business data, against hostile values: whatever a row holds, the
request goes to the declared host, each path value stays in its own segment (or the call is
refused when it would make a segment empty, `.` or `..`), and each query value stays the value of
its own key — as httpx, which sends the request, reads the URL."""

from __future__ import annotations

from urllib.parse import unquote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.kinds.effects.http import DOT_SEGMENTS, fill_url

TEMPLATE = "https://partner.example/holds/{a}/release/{b}?tenant={c}&v=1"
HOSTILE = st.one_of(
    st.sampled_from(["", ".", "..", "%2e%2e", "../..", "/", "a/b", "@evil.example", "evil.example:80", "?x=1",
                     "#top", "&v=2", "a=b", "\\..", "\n", " ", "{b}", "\u2028", "\uff45\uff56\uff49\uff4c",
                     "..;", ".%2e"]),
    st.text(st.characters(codec="utf-8"), max_size=30),
)


def _segments(url: httpx.URL) -> list[str]:
    return [unquote(part) for part in url.raw_path.decode().partition("?")[0].split("/")[1:]]


@given(a=HOSTILE, b=HOSTILE, c=HOSTILE)
def test_a_value_stays_in_its_segment_or_query_value_and_never_moves_the_host(a: str, b: str, c: str) -> None:
    try:
        url = httpx.URL(fill_url(TEMPLATE, {"a": a, "b": b, "c": c}))
    except ValueError as exc:
        assert a in DOT_SEGMENTS or b in DOT_SEGMENTS, exc
        return
    assert a not in DOT_SEGMENTS and b not in DOT_SEGMENTS
    assert (url.scheme, url.host, url.port, url.userinfo, url.fragment) == ("https", "partner.example", None, b"", "")
    assert _segments(url) == ["holds", a, "release", b]
    assert list(url.params.multi_items()) == [("tenant", c), ("v", "1")]


@given(a=HOSTILE, b=HOSTILE)
def test_two_values_in_one_segment_may_not_make_a_dot_segment_together(a: str, b: str) -> None:
    try:
        url = httpx.URL(fill_url("https://partner.example/x/{a}{b}/y", {"a": a, "b": b}))
    except ValueError:
        assert a + b in DOT_SEGMENTS
        return
    assert _segments(url) == ["x", a + b, "y"]


@pytest.mark.parametrize("value", ["..", "."])
def test_a_dot_value_is_refused_naming_the_placeholder(value: str) -> None:
    with pytest.raises(ValueError, match=rf"URL placeholder {{a}} makes the path segment '{value}'"):
        fill_url(TEMPLATE, {"a": value, "b": "1", "c": "t"})
