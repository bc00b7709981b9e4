"""An operation's trace context: the W3C `traceparent` header its records carry.

A `traceparent` read from a record, a request or a caller is outside input: `traceparent_of` keeps a
well-formed one (version 00 as it is; a later version cut to the fields version 00 knows, as the
W3C Trace Context spec asks) and drops anything else, so a malformed header never fails a record.
Nothing here needs OpenTelemetry: the header is carried whether spans are recorded or not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

TRACEPARENT = "traceparent"
# Longest header value looked at: a version 00 one is 55 characters; later versions may add fields.
MAX_TRACEPARENT = 256
_FIELDS = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_LENGTH_00 = 55
_NO_TRACE, _NO_PARENT = "0" * 32, "0" * 16


def traceparent_of(value: Any) -> str | None:
    """The valid `traceparent` in `value` (str or bytes), as version 00; None for anything else:
    missing, not ASCII, too long, upper-case hex, version ff, an all-zero trace or parent id, a
    version 00 with more after it, a later version whose fields are not followed by `-`."""
    if isinstance(value, bytes):
        if len(value) > MAX_TRACEPARENT or not value.isascii():
            return None
        value = value.decode("ascii")
    elif not isinstance(value, str) or len(value) > MAX_TRACEPARENT:
        return None
    found = _FIELDS.match(value)
    if found is None:
        return None
    version, trace_id, parent_id, flags = found.groups()
    if version == "ff" or trace_id == _NO_TRACE or parent_id == _NO_PARENT:
        return None
    if version == "00":
        return value if len(value) == _LENGTH_00 else None
    if len(value) > _LENGTH_00 and value[_LENGTH_00] != "-":
        return None
    return f"00-{trace_id}-{parent_id}-{flags}"


def traceparent_in(headers: Mapping[str, Any] | Iterable[tuple[Any, Any]] | None) -> str | None:
    """The valid `traceparent` among a record's headers ((name, value) pairs as the consumer gives
    them, or a mapping); None when there is none, when it is malformed, or when there are several
    (which one would be the sender's is unknown)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    found: list[Any] = [value for name, value in pairs if name == TRACEPARENT]
    return traceparent_of(found[0]) if len(found) == 1 else None


def carried(headers: list[tuple[str, Any]], traceparent: str | None) -> list[tuple[str, Any]]:
    """`headers` with the `traceparent` (as bytes) appended when there is one."""
    return [*headers, (TRACEPARENT, traceparent.encode())] if traceparent else headers


def is_sampled(traceparent: str) -> bool:
    """Whether a valid `traceparent`'s sender recorded its trace (the `sampled` flag)."""
    return bool(int(traceparent[-2:], 16) & 1)


def trace_id_of(traceparent: str) -> str:
    """The trace id (32 hex digits) of a valid `traceparent`."""
    return traceparent[3:35]
