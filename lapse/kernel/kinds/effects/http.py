"""`effect: {http: {url: …}}`: call an HTTP endpoint per operation (the caller: processors/effects/http)."""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any, ClassVar, Literal
from urllib.parse import quote

from pydantic import Field
from sqlalchemy import Table

from lapse.kernel.kinds.columns import column_of
from lapse.kernel.kinds.effects.base import CompileContext, ExternalEffectType
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.text import one_line

CALL_PLACEHOLDERS = {"op_key", "subject_id", "tenant"}  # filled from the call, not the row


class HttpEffect(ExternalEffectType):
    """Call an HTTP endpoint per operation. `url` is a template over the business row's columns
    and `{op_key}`, `{subject_id}`, `{tenant}`, whose placeholders stand in path segments or query
    values only (never in the host: row data must not choose where the headers go); every value is
    URL-encoded, so it stays inside its segment or value, and a path segment a value would make
    empty, `.` or `..` is refused."""

    tag: ClassVar[str] = "http"

    method: Literal["POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str = Field(min_length=1, max_length=2000)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0, le=300)
    then_set: dict[str, Any] = Field(
        default_factory=dict, description="Columns set on the business row once the call succeeded.")

    def checked(self, ctx: CompileContext) -> HttpEffect:
        if not _SCHEME.match(self.url):
            raise KindError(f"{self.field}.url", "expected an http:// or https:// URL template")
        url_placeholders(self.url, ctx.table, f"{self.field}.url")
        return self


_SCHEME = re.compile(r"^https?://", re.IGNORECASE)
_DELIMITERS = re.compile(r"([/?&=#])")
# How a URL's part changes at a delimiter: after the authority (host and port) come the path, the
# query's keys and values, the fragment.
_NEXT_PART = {("authority", "/"): "path", ("authority", "?"): "query key", ("authority", "#"): "fragment",
              ("path", "?"): "query key", ("path", "#"): "fragment",
              ("query key", "="): "query value", ("query key", "&"): "query key", ("query key", "#"): "fragment",
              ("query value", "&"): "query key", ("query value", "#"): "fragment"}
PLACEHOLDER_PARTS = ("path", "query value")
DOT_SEGMENTS = ("", ".", "..")  # what a path segment made by a value may not be


def url_pieces(template: str) -> list[tuple[str, str | None, str]]:
    """The template as (literal text, placeholder name or None, URL part) pieces in order, each
    delimiter (`/ ? & = #`) a piece of its own, each piece in one part: scheme, authority, path,
    query key, query value, fragment. ValueError when the template is malformed."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"not a URL template: {exc}") from None
    scheme = _SCHEME.match(template)
    skip = scheme.end() if scheme else 0
    pieces: list[tuple[str, str | None, str]] = [(template[:skip], None, "scheme")] if skip else []
    part = "authority"
    for literal, name, _, _ in parsed:
        for token in _DELIMITERS.split(literal[skip:]):
            if token and token in "/?&=#":
                part = _NEXT_PART.get((part, token), part)
            if token:
                pieces.append((token, None, part))
        skip = 0
        if name is not None:
            pieces.append(("", name, part))
    return pieces


def url_placeholders(url: str, table: Table, field: str) -> None:
    """Every `{name}` of a URL template is a column of the table or op_key/subject_id/tenant, in a
    path segment or a query value."""
    try:
        parts = list(string.Formatter().parse(url))
        pieces = url_pieces(url)
    except ValueError as exc:
        raise KindError(field, f"not a URL template: {str(exc).removeprefix('not a URL template: ')}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if spec or conversion:
            raise KindError(field, f"placeholder {show(name)} takes no format spec or conversion")
        if name not in CALL_PLACEHOLDERS:
            column_of(table, name, field)
    for _, name, part in pieces:
        if name is not None and part not in PLACEHOLDER_PARTS:
            raise KindError(field, f"placeholder {show(name)} is in the URL's {part}; placeholders go in "
                                   "path segments and query values only")


def _check_segment(segment: list[str], named: list[str]) -> None:
    if named and "".join(segment) in DOT_SEGMENTS:
        raise ValueError(f"URL placeholder {{{one_line(named[-1], 63)}}} makes the path segment "
                         f"{''.join(segment)!r}, which would not stay in its place")


def fill_url(template: str, values: Mapping[str, Any]) -> str:
    """The template with every `{name}` replaced by the URL-encoded value of that name (`{{` and
    `}}` are literal braces, as the compiler reads the template): the URL the caller requests and
    the preview shows. ValueError when the template is malformed, a name has no value, or a path
    segment made with a value would be empty, `.` or `..` (it would not stay in its place)."""
    out: list[str] = []
    segment: list[str] = []  # the path segment being written, and the placeholders in it
    named: list[str] = []
    for text, name, part in url_pieces(template):
        if part != "path" or text == "/":  # the segment being written ends here
            _check_segment(segment, named)
            segment, named = [], []
        if name is not None:
            raw = values.get(name)
            if raw is None:
                raise ValueError(f"URL placeholder {{{one_line(name, 63)}}} has no value in the row")
            text = quote(raw.isoformat() if isinstance(raw, (date, datetime)) else str(raw), safe="")
        if part == "path" and text != "/":
            segment.append(text)
            named += [name] if name is not None else []
        out.append(text)
    _check_segment(segment, named)
    return "".join(out)
