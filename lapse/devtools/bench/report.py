"""The bench's figures: ratios against the baselines and ceilings, targets, and the text table."""

from __future__ import annotations

from typing import Any

TARGETS = {  # ratio or figure → the least it should be (latency: the most)
    "lapse_vs_naive": 20.0, "lapse_vs_faust": 5.0, "lapse_vs_limit": 0.6,
    "reconciler_rows_per_s": 100_000.0, "audit_records_per_s": 100_000.0,
}
P99_TARGET_MS = 1000.0


def _ratio(a: float, b: float | None) -> float | None:
    return round(a / b, 2) if b else None


def summarize(out: dict[str, Any], default_batch: int) -> dict[str, Any]:
    """Add the best Lapse run, the ratios and the target checks to a run's raw figures."""
    best = max(out["lapse"], key=lambda r: r["events_per_s"])
    one = next(r for r in out["lapse"] if r["workers"] == 1 and r["batch_size"] == default_batch)
    limit_at = {r["batch_size"]: r["events_per_s"] for r in out["limit"]}
    faust = out.get("faust", {}).get("events_per_s")
    ratios = {
        "lapse_vs_naive": _ratio(best["events_per_s"], out["naive"]["events_per_s"]),
        "lapse_vs_faust": _ratio(best["events_per_s"], faust),
        "lapse_vs_limit": _ratio(best["events_per_s"], limit_at.get(best["batch_size"])),
        "lapse_1worker_vs_limit": _ratio(one["events_per_s"], limit_at.get(default_batch)),
        "lapse_vs_copy": _ratio(best["events_per_s"], out["copy"]["rows_per_s"]),
    }
    figures = {**ratios, "reconciler_rows_per_s": out["reconciler_scan"]["rows_per_s"],
               "audit_records_per_s": out["audit_replay"]["records_per_s"]}
    targets = {k: (figures[k] is not None and figures[k] >= v) for k, v in TARGETS.items()}
    targets["latency_p99_ms"] = out["latency"]["p99_ms"] < P99_TARGET_MS
    return {**out, "lapse_best": {"workers": best["workers"], "batch_size": best["batch_size"],
                                  "events_per_s": best["events_per_s"]},
            "lapse_1worker_events_per_s": one["events_per_s"], **ratios, "targets_met": targets}


def table(result: dict[str, Any]) -> str:
    """A person's view of the result: one line per stage, then the ratios."""
    rows = [("stage", "events", "rate/s", "note")]
    for r in result["limit"]:
        rows.append((f"limit: batch txn (batch {r['batch_size']})", r["events"], r["events_per_s"], "no Kafka"))
    c = result["copy"]
    rows.append(("limit: COPY into ledger", c["rows"], c["rows_per_s"], "any write path's ceiling"))
    for r in result["lapse"]:
        note = f"start-up {r['startup_s']}s, offsets committed: {r['offsets_committed']}"
        rows.append((f"lapse: {r['workers']} worker(s), batch {r['batch_size']}", r["events"],
                     r["events_per_s"], note))
    rows.append(("naive: txn + sync commit per msg", result["naive"]["events"],
                 result["naive"]["events_per_s"], ""))
    if "faust" in result:
        rows.append(("faust: agent, one event at a time", result["faust"]["events"],
                     result["faust"]["events_per_s"], f"start-up {result['faust']['startup_s']}s"))
    lat = result["latency"]
    rows.append(("latency (1 worker)", lat["events"], lat["offered_events_per_s"],
                 f"p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms, p99 {lat['p99_ms']} ms "
                 f"(observed p99 {lat['observed_p99_ms']} ms)"))
    s = result["reconciler_scan"]
    rows.append(("reconciler scan", s["rows"], s["rows_per_s"], s["method"]))
    a = result["audit_replay"]
    rows.append(("audit replay", a["records"], a["records_per_s"], a["method"]))
    widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
    lines = [f"{r[0]!s:<{widths[0]}}  {r[1]!s:>{widths[1]}}  {r[2]!s:>{widths[2]}}  {r[3]}"
             for r in rows]
    lines.append("")
    for key in ("lapse_vs_naive", "lapse_vs_faust", "lapse_vs_limit", "lapse_1worker_vs_limit", "lapse_vs_copy"):
        lines.append(f"{key:<24} {result[key]}")
    missed = [k for k, ok in result["targets_met"].items() if not ok]
    lines.append(f"targets missed: {', '.join(missed) if missed else 'none'}")
    return "\n".join(lines)
