"""`--plot FILE.png`: throughput per stage (bars) and the latency histogram, with matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def stage_rates(result: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, events/s) per stage, in the table's order (a stage that has no rate is left out)."""
    rates = [("consumer alone", result["consumer"]["events_per_s"]), ("db bound", result["db_bound"]["events_per_s"])]
    rates += [(f"txn alone b{r['batch_size']}", r["events_per_s"]) for r in result["transaction_alone"]]
    rates += [(f"lapse {r['workers']}w b{r['batch_size']}", r["events_per_s"]) for r in result["lapse"]]
    rates += [(name.replace("_", " "), result[name]["events_per_s"])
              for name in ("quix", "naive", "faust", "batched_naive") if name in result]
    return [(label, rate) for label, rate in rates if rate]


def write_plot(result: dict[str, Any], path: Path) -> None:
    """Write a two-panel PNG to `path` (matplotlib imported only here, with a file backend)."""
    # function-local: matplotlib is an optional extra (bench), slow to import, and needs its
    # backend chosen before pyplot is imported
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, hist) = plt.subplots(1, 2, figsize=(13, 5))
    labels, values = zip(*stage_rates(result), strict=True)
    bars.barh(labels, values, color="tab:blue")
    bars.set_xscale("log")
    bars.set_xlabel("events/s (log scale)")
    bars.set_title(f"Throughput per stage, {result['events']} events")
    bars.invert_yaxis()
    lat = result["latency"]
    hist.hist(lat["latencies_ms"], bins=50, color="tab:orange")
    for q in (50, 95, 99):
        hist.axvline(lat[f"p{q}_ms"], linestyle="--", color="black", linewidth=0.8)
        hist.text(lat[f"p{q}_ms"], hist.get_ylim()[1] * 0.95, f" p{q}", fontsize=8)
    hist.set_xlabel("produce → ledger terminal (ms)")
    hist.set_title(f"Latency at {lat['offered_events_per_s']:.0f} events/s offered, one worker")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
