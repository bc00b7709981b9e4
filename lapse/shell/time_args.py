"""Click parameter types for points in time and durations given on the command line.

A timestamp is ISO 8601 (a naive one is UTC), epoch milliseconds, or a duration meaning that long
ago (`2h`); a duration is `<n><unit>` with unit ms, s, m, h or d.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")


# What a timestamp option's help says it takes.
TIMESTAMP_FORMS = "ISO 8601, epoch ms, or a duration ago like 2h"


def parse_timestamp(text: str, now: datetime | None = None) -> datetime:
    """An aware UTC datetime from ISO 8601, epoch milliseconds or a duration before `now` (default:
    this machine's clock); ValueError with a one-line reason."""
    value = text.strip()
    if value.isdigit():
        return datetime.fromtimestamp(int(value) / 1000, UTC)
    if _DURATION.match(value):
        return (now or datetime.now(UTC)) - parse_duration(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text[:80]!r} is not an ISO 8601 timestamp, epoch milliseconds or a duration "
                         "ago like 2h") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text[:80]!r} is not a duration like 30s, 15m, 2h or 1d")
    return timedelta(seconds=float(match[1]) * _UNITS[match[2]])


class Timestamp(click.ParamType):
    name = "TS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_timestamp(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Duration(click.ParamType):
    """A duration option; `as_seconds=True` gives float seconds (for `*_s` settings), and takes a
    plain number as seconds too."""

    name = "DURATION"

    def __init__(self, as_seconds: bool = False) -> None:
        self.as_seconds = as_seconds

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float | timedelta:
        if isinstance(value, (timedelta, int, float)):
            seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
        elif self.as_seconds and _SECONDS.match(value.strip()):  # a plain number of seconds, as the setting
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(value).total_seconds()
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return seconds if self.as_seconds else timedelta(seconds=seconds)


TIMESTAMP = Timestamp()
DURATION = Duration()

