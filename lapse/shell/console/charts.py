"""The console's charts as geometry for server-rendered SVG (`templates/_chart.html`): stacked bars
per time bucket or lines through per-bucket values, on a time axis ending now, with a y axis
rounded up to 1, 2 or 5 times a power of ten. No script draws them; each bar and point carries
its exact figures in a `<title>` (shown on hover)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

WIDTH, HEIGHT = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 10, 22
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


@dataclass(frozen=True)
class Series:
    """One named series: a value (None: not known) per bucket, drawn with CSS class `css`."""

    name: str
    css: str
    values: list[float | None]


@dataclass
class Chart:
    """What `_chart.html` draws: axes, bars (x, y, w, h, css, title), lines (css, points) and
    their points (x, y, title), and the legend."""

    id: str
    title: str
    unit: str
    y_max: float
    y_ticks: list[tuple[float, str]]
    x_ticks: list[tuple[float, str]]
    bars: list[tuple[float, float, float, float, str, str]] = field(default_factory=list)
    lines: list[tuple[str, str]] = field(default_factory=list)
    points: list[tuple[float, float, str, str]] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    empty: bool = True
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is at least `value` (1 for nothing)."""
    if value <= 1:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= value)


def figure(value: float, unit: str) -> str:
    """A short label: seconds as s/min/h, counts as 950, 1.2k, 3.4M."""
    if unit == "s":
        for size, name in ((3600.0, "h"), (60.0, "min")):
            if value >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.3g} s"
    for size, name in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{name}"
    return f"{value:.3g}"


def _axes(chart_id: str, title: str, unit: str, span: timedelta, top: float) -> Chart:
    y_max = nice_ceiling(top)
    y_ticks = [(TOP + PLOT_H - PLOT_H * f, figure(y_max * f, unit)) for f in (0, 0.5, 1)]
    hours = span >= timedelta(hours=6)
    x_ticks = []
    for f in (0, 0.25, 0.5, 0.75, 1):
        back = span * (1 - f)
        label = "now" if f == 1 else (f"-{back.total_seconds() / 3600:.0f} h" if hours
                                      else f"-{back.total_seconds() / 60:.0f} min")
        x_ticks.append((LEFT + PLOT_W * f, label))
    return Chart(chart_id, title, unit, y_max, y_ticks, x_ticks)


def _y(value: float, y_max: float) -> float:
    return round(TOP + PLOT_H - PLOT_H * min(value, y_max) / y_max, 1)


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M UTC")


def stacked_bars(chart_id: str, title: str, unit: str, span: timedelta, starts: list[datetime],
                 stacks: list[Series]) -> Chart:
    """Bars per bucket (`starts`), the series stacked bottom up in the order given."""
    totals = [sum(s.values[i] or 0 for s in stacks) for i in range(len(starts))]
    chart = _axes(chart_id, title, unit, span, max(totals, default=0))
    chart.legend = [(s.css, s.name) for s in stacks]
    width = PLOT_W / max(len(starts), 1)
    for i, at in enumerate(starts):
        base = 0.0
        parts = ", ".join(f"{s.name} {figure(s.values[i] or 0, unit)}" for s in stacks)
        for s in stacks:
            value = s.values[i] or 0
            if value <= 0:
                continue
            top, bottom = _y(base + value, chart.y_max), _y(base, chart.y_max)
            chart.bars.append((round(LEFT + i * width + 0.5, 1), top, round(max(width - 1, 0.5), 1),
                               round(max(bottom - top, 0.5), 1), s.css, f"{_stamp(at)}: {parts}"))
            base += value
            chart.empty = False
    return chart


def lines(chart_id: str, title: str, unit: str, span: timedelta, starts: list[datetime],
          series: list[Series]) -> Chart:
    """A line per series through its known values, one point per bucket (`starts`)."""
    top = max((v for s in series for v in s.values if v is not None), default=0)
    chart = _axes(chart_id, title, unit, span, top)
    chart.legend = [(s.css, s.name) for s in series]
    width = PLOT_W / max(len(starts), 1)
    for s in series:
        points = []
        for i, (at, value) in enumerate(zip(starts, s.values, strict=True)):
            if value is None:
                continue
            x, y = round(LEFT + (i + 0.5) * width, 1), _y(value, chart.y_max)
            points.append(f"{x},{y}")
            chart.points.append((x, y, s.css, f"{_stamp(at)}: {s.name} {figure(value, unit)}"))
        if points:
            chart.lines.append((s.css, " ".join(points)))
            chart.empty = False
    return chart


__all__ = ["Chart", "Series", "figure", "lines", "nice_ceiling", "stacked_bars"]
