"""Whether a soak held steady: lag and outbox backlog without an upward trend over the run's last
half, table sizes bounded by pruning, and the last minute's throughput at least 90% of the first's.

A trend is the least-squares slope over the last half's samples times that half's length: what
the quantity gained across it. It counts as upward only above a floor (`TREND_FLOOR_S` seconds
of offered load, or a quarter of the quantity's mean there), so the sawtooth of batches and
sweep passes is not read as growth, while a backlog that keeps building is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lapse.devtools.soak.samples import Sample

TREND_FLOOR_S = 10.0      # of offered load: a trend smaller than this many seconds' events is noise
SIZE_GROWTH_LIMIT = 0.10  # total table size may grow this much over the last half, no more
THROUGHPUT_HELD = 0.90    # last minute's throughput, at least this share of the first minute's


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ys over xs (0 for fewer than two distinct xs)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def gained_over_last_half(samples: Sequence[Sample], value: str) -> tuple[float, float]:
    """(what `value` gained across the last half by its trend, its mean over that half)."""
    half = list(samples[len(samples) // 2:])
    xs = [s.elapsed_s for s in half]
    ys = [float(getattr(s, value) or 0.0) for s in half]
    span = (xs[-1] - xs[0]) if len(xs) > 1 else 0.0
    return slope(xs, ys) * span, (sum(ys) / len(ys) if ys else 0.0)


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail}


def bounded(samples: Sequence[Sample], value: str, rate: float) -> Check:
    gained, mean = gained_over_last_half(samples, value)
    floor = max(rate * TREND_FLOOR_S, 0.25 * mean)
    return Check(gained <= floor, f"gained {gained:.0f} over the last half (mean {mean:.0f}, allowed {floor:.0f})")


def sizes_bounded(samples: Sequence[Sample]) -> Check:
    """The tables the run's pruning bounds grow no more than SIZE_GROWTH_LIMIT over the last half.
    Tables retained by whole time partitions (a day of the outbox, a week of transitions) are
    reported, not judged: their rotation comes after the run (tests/integration/test_prune.py
    drives it with a fake clock)."""
    half = samples[len(samples) // 2:]
    first, last = half[0].pruned_mb, half[-1].pruned_mb
    allowed = first * (1 + SIZE_GROWTH_LIMIT)
    rotated = [f"{t} {half[0].table_mb.get(t, 0)} to {half[-1].table_mb.get(t, 0)} MB" for t in half[-1].rotated]
    detail = f"{first} MB to {last} MB over the last half (allowed {allowed:.1f} MB)"
    if rotated:
        detail += f"; rotated by partitions, not judged: {', '.join(rotated)}"
    return Check(last <= allowed, detail)


def throughput_held(per_minute: Sequence[float]) -> Check:
    if len(per_minute) < 2:
        return Check(False, "fewer than two minutes measured")
    first, last = per_minute[0], per_minute[-1]
    return Check(last >= THROUGHPUT_HELD * first,
                 f"last minute {last:.0f}/min, first {first:.0f}/min (at least {THROUGHPUT_HELD:.0%} of it)")


def per_minute(samples: Sequence[Sample]) -> list[float]:
    """Terminal ledger rows per whole minute of the run (samples grouped by the minute they end in)."""
    minutes: dict[int, int] = {}
    for s in samples[1:]:
        minute = int((s.elapsed_s - 1e-6) // 60)
        minutes[minute] = minutes.get(minute, 0) + s.finished
    whole = [n for m, n in sorted(minutes.items()) if (m + 1) * 60 <= samples[-1].elapsed_s + 1]
    return [float(n) for n in whole]


def judge(samples: Sequence[Sample], rate: float) -> dict[str, Check]:
    """Every target of the soak on its samples (at least three)."""
    if len(samples) < 3:
        missing = Check(False, f"{len(samples)} samples: too short to judge")
        return {name: missing for name in ("lag_bounded", "outbox_bounded", "sizes_bounded", "throughput_held")}
    return {
        "lag_bounded": bounded(samples, "lag_records", rate),
        "outbox_bounded": bounded(samples, "outbox_unsent", rate),
        "sizes_bounded": sizes_bounded(samples),
        "throughput_held": throughput_held(per_minute(samples)),
    }
