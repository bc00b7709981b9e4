"""Times as people read them on the console: relative to now ("4 min ago"), with the exact UTC time
in the element's title (shown on hover) and its `datetime` attribute."""

from __future__ import annotations

from datetime import UTC, datetime

from markupsafe import Markup, escape

_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))


def parse_time(value: datetime | str | None) -> datetime | None:
    """A datetime of `value` (an aware datetime or an ISO 8601 string; naive means UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def relative(at: datetime, now: datetime) -> str:
    """`at` from `now` in the largest whole unit: "just now", "5 s ago", "3 h ago", "in 2 min"."""
    seconds = (now - at).total_seconds()
    if abs(seconds) < 1:
        return "just now"
    size, unit = next((s, u) for s, u in _UNITS if abs(seconds) >= s)
    amount = int(abs(seconds) // size)
    return f"{amount} {unit} ago" if seconds > 0 else f"in {amount} {unit}"


def exact(at: datetime) -> str:
    """`at` in UTC to the second, as the title of its element."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def time_element(value: datetime | str | None, now: datetime) -> Markup:
    """`<time>` with the relative time as its text and the exact one on hover; empty for None."""
    at = parse_time(value)
    if at is None:
        return Markup(escape(value or ""))
    iso = at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(iso, exact(at), relative(at, now))


__all__ = ["exact", "parse_time", "relative", "time_element"]
