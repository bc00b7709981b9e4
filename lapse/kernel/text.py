"""Outside text as one safe line: for logs, error messages and the reasons the ledger keeps.

Text that may quote outside input (a value, a far side's answer, a driver's error) passes through
`one_line` before it is logged, shown or stored, so it can neither break a line nor flood one.
"""

from __future__ import annotations

import re

# C0 and C1 controls (line breaks, NUL, DEL included), the Unicode line and paragraph separators,
# and lone surrogates (not encodable in UTF-8).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def one_line(text: str, limit: int, *, escape: bool = False) -> str:
    """`text` as one line of at most `limit` characters: each unsafe character becomes a space,
    runs of whitespace one space, and a longer line is cut, ending in "…". With `escape` each unsafe
    character becomes its `\\uXXXX` escape instead and the line is cut at `limit` as it stands: for
    reasons kept as evidence, which quote outside values exactly."""
    if escape:
        return UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)[:limit]
    line = " ".join(UNSAFE.sub(" ", text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
