"""`effect: {http: {url: …}}`: call an HTTP endpoint per operation (the caller: processors/effects/http)."""

from __future__ import annotations

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
    and `{op_key}`, `{subject_id}`, `{tenant}`; every placeholder value is URL-encoded."""

    tag: ClassVar[str] = "http"

    method: Literal["POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str = Field(min_length=1, max_length=2000)
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0, le=300)
    then_set: dict[str, Any] = Field(
        default_factory=dict, description="Columns set on the business row once the call succeeded.")

    def checked(self, ctx: CompileContext) -> HttpEffect:
        if not self.url.lower().startswith(("http://", "https://")):
            raise KindError(f"{self.field}.url", "expected an http:// or https:// URL template")
        url_placeholders(self.url, ctx.table, f"{self.field}.url")
        return self


def url_placeholders(url: str, table: Table, field: str) -> None:
    """Every `{name}` of a URL template is a column of the table or op_key/subject_id/tenant."""
    try:
        parts = list(string.Formatter().parse(url))
    except ValueError as exc:
        raise KindError(field, f"not a URL template: {exc}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if spec or conversion:
            raise KindError(field, f"placeholder {show(name)} takes no format spec or conversion")
        if name not in CALL_PLACEHOLDERS:
            column_of(table, name, field)


def fill_url(template: str, values: Mapping[str, Any]) -> str:
    """The template with every `{name}` replaced by the URL-encoded value of that name (`{{` and
    `}}` are literal braces, as the compiler reads the template): the URL the caller requests and
    the preview shows. ValueError when the template is malformed or a name has no value."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"URL template is malformed: {exc}") from None
    out: list[str] = []
    for literal, name, _, _ in parts:
        out.append(literal)
        if name is None:
            continue
        raw = values.get(name)
        if raw is None:
            raise ValueError(f"URL placeholder {{{one_line(name, 63)}}} has no value in the row")
        text = raw.isoformat() if isinstance(raw, (date, datetime)) else str(raw)
        out.append(quote(text, safe=""))
    return "".join(out)
