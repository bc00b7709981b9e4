"""The overview: the verdict and why, the `lapse status` figures, and the charts of the last hour
or day (throughput by outcome, dead letters waiting, the oldest eligible age, lag per judged group).
The page refreshes its live part in place (`static/console.js`); the same data is
`/api/v1/overview` and `/api/v1/charts`."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from lapse.shell.console import views
from lapse.shell.console.access import Identity
from lapse.shell.console.charts import Chart, Series, lines, stacked_bars
from lapse.shell.console.samples import OUTCOMES, WINDOWS, Window

if TYPE_CHECKING:
    from lapse.shell.console.core import Console

REFRESH_S = 15
REFRESH_RANGE_S = (2, 300)  # what `?every=` may ask for


def window_of(request: Request) -> Window:
    return WINDOWS.get(request.query_params.get("window", "hour"), WINDOWS["hour"])


def chart_figures(console: Console, window: Window, now: datetime, waiting_now: int) -> dict[str, Any]:
    """Per bucket of `window`: transitions by outcome, the dead letters waiting at its end (counted
    back from `waiting_now`), and the last sample of the oldest eligible age (0: nothing eligible)
    and of each judged group's lag taken in it (None: no sample)."""
    buckets = console.samples.buckets(window, now)
    starts = [at for at, _ in buckets]
    waiting: list[int] = [0] * len(buckets)
    level = waiting_now
    for i in range(len(buckets) - 1, -1, -1):
        waiting[i] = max(level, 0)
        counts = buckets[i][1]
        level -= counts.get("dead_letter", 0) - counts.get("out_of_dead_letter", 0)
    ages: list[float | None] = [None] * len(buckets)
    lag: dict[str, list[int | None]] = {}
    for sample in console.samples.gauge_series(window, now):
        i = min(int((sample.at - starts[0]).total_seconds() // window.step_s), len(buckets) - 1)
        if i < 0:
            continue
        ages[i] = sample.oldest_eligible_age_s or 0.0  # sampled, nothing eligible: no age
        for group, records in sample.lag.items():
            lag.setdefault(group, [None] * len(buckets))[i] = records
    return {"window": window.name, "step_s": window.step_s, "buckets": starts,
            "throughput": {o: [c.get(o, 0) for _, c in buckets] for o in OUTCOMES},
            "dead_letters_waiting": waiting, "oldest_eligible_age_s": ages, "lag": dict(sorted(lag.items())),
            "sampled_since": min((s.at for s in console.samples.gauge_series(window, now)), default=None)}


def draw(figures: dict[str, Any], window: Window) -> list[Chart]:
    starts, span = figures["buckets"], window.span
    per = "minute" if window.step_s == 60 else f"{window.step_s // 60} min"
    return [
        stacked_bars("throughput-chart", f"Throughput (transitions per {per}, by outcome)", "", span, starts,
                     [Series(o.replace("_", " "), f"s-{o}", figures["throughput"][o]) for o in OUTCOMES]),
        lines("dead-letters-chart", "Dead letters waiting", "", span, starts,
              [Series("waiting", "s-dead_letter", figures["dead_letters_waiting"])]),
        lines("eligible-chart", "Oldest eligible age", "s", span, starts,
              [Series("oldest eligible", "s-age", figures["oldest_eligible_age_s"])]),
        lines("lag-chart", "Consumer lag (records behind, groups judged)", "", span, starts,
              [Series(group, f"s-lag{i % 4}", values) for i, (group, values) in enumerate(figures["lag"].items())]),
    ]


def routes(console: Console) -> list[BaseRoute]:
    def data(request: Request, who: Identity) -> dict[str, Any]:
        now = views.now_utc()
        found = views.overview(console.settings, console.engine, now)
        console.samples.record(found["status"], now)
        window = window_of(request)
        figures = chart_figures(console, window, now, found["status"]["dead_letters"])
        return {**found, "charts": figures}

    def page(request: Request, who: Identity) -> dict[str, Any]:
        found = data(request, who)
        window = window_of(request)
        every = request.query_params.get("every", "")
        refresh = min(max(int(every), REFRESH_RANGE_S[0]), REFRESH_RANGE_S[1]) if every.isdigit() else REFRESH_S
        return {**found, "chart_list": draw(found["charts"], window), "window": window.name,
                "windows": list(WINDOWS), "refresh_s": refresh}

    def charts(request: Request, who: Identity) -> dict[str, Any]:
        figures: dict[str, Any] = data(request, who)["charts"]
        return figures

    return [Route("/", console.page("overview.html", page)),
            Route("/api/v1/overview", console.api(data)),
            Route("/api/v1/charts", console.api(charts))]
