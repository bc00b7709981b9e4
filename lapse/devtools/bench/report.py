"""The bench's figures: ratios against the limit, the Quix Streams peer and the baselines,
targets, and the text table.

Every ratio compares Lapse with ONE worker at the default batch size, except `lapse_2w_vs_1w`
(the best of the runs with two or more workers over one, all at the default batch, each count of
workers joined before its events were produced) and
`batch_vs_db_bound` (the batch transaction alone, no Kafka, over the database's lower bound for
the same writes). The limit is what one worker could do if it were nothing but the consumer and
the database's lower bound in a row: per event, the consumer alone's time plus the bound's. A
cleanup stage whose end state was not verified (`verified: false`) has no rate that counts: its
ratios are null, and a null ratio misses its target. The naive consumer and Faust are reference
rows: their ratios are shown, with no target.
"""

from __future__ import annotations

from typing import Any

TARGETS = {  # ratio or figure → the least it should be (latency: the most, P99_TARGET_MS)
    "lapse_vs_limit": 0.7, "lapse_vs_quix": 1.3, "batch_vs_db_bound": 0.8, "lapse_2w_vs_1w": 1.5,
    "relay_vs_lapse": 2.0, "reconciler_rows_per_s": 100_000.0, "audit_records_per_s": 100_000.0,
}
P99_TARGET_MS = 250.0
DECODE_TARGET = 1.5  # decode and validation over fastavro's own read of the same bodies, at most
CONSOLE_PAGE_TARGET_MS = 300.0  # the slowest console page's median render, at most
RATIOS = ("lapse_vs_limit", "lapse_vs_quix", "batch_vs_db_bound", "lapse_vs_consumer", "lapse_vs_batched_naive",
          "lapse_vs_naive", "lapse_vs_faust", "lapse_2w_vs_1w", "relay_vs_lapse")
BASELINES = ("quix", "naive", "faust", "batched_naive")


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def counted_rate(stage: dict[str, Any] | None) -> float | None:
    """A cleanup stage's events/s if its end state was verified, else None (it does not count)."""
    if not stage or not stage.get("verified"):
        return None
    rate = stage.get("events_per_s")
    return float(rate) if rate else None


def limit_rate(consumer: float | None, bound: float | None) -> float | None:
    """Events/s of a worker that only consumed and decoded, then wrote with the database's lower
    bound, one after the other: 1 / (1/consumer + 1/bound)."""
    return 1 / (1 / consumer + 1 / bound) if consumer and bound else None


def summarize(out: dict[str, Any], default_batch: int) -> dict[str, Any]:
    """Add the best Lapse run, the limit, the ratios and the target checks to a run's raw figures."""
    best = max(out["lapse"], key=lambda r: counted_rate(r) or -1.0)
    one = _lapse_at(out["lapse"], 1, default_batch)
    if one is None:
        raise ValueError(f"no Lapse run with one worker at batch {default_batch}")
    # Workers side by side: the runs where they joined before the events came, over the same for one.
    joined = [r for r in out["lapse"] if r.get("joined_first") and r["batch_size"] == default_batch]
    more = [counted_rate(r) for r in joined if r["workers"] >= 2]
    joined_one = next((counted_rate(r) for r in joined if r["workers"] == 1), None)
    one_rate = counted_rate(one)
    limit = limit_rate(out["consumer"].get("events_per_s"), counted_rate(out.get("db_bound")))
    alone = next((r for r in out["transaction_alone"] if r["batch_size"] == default_batch), None)
    ratios = {
        "lapse_vs_limit": _ratio(one_rate, limit),
        "lapse_vs_quix": _ratio(one_rate, counted_rate(out.get("quix"))),
        "batch_vs_db_bound": _ratio(counted_rate(alone), counted_rate(out.get("db_bound"))),
        "lapse_vs_consumer": _ratio(one_rate, out["consumer"].get("events_per_s")),
        "lapse_vs_batched_naive": _ratio(one_rate, counted_rate(out.get("batched_naive"))),
        "lapse_vs_naive": _ratio(one_rate, counted_rate(out.get("naive"))),
        "lapse_vs_faust": _ratio(one_rate, counted_rate(out.get("faust"))),
        "lapse_2w_vs_1w": _ratio(max((r for r in more if r), default=None), joined_one),
        "relay_vs_lapse": _ratio(_relay_rate(out.get("relay")), one_rate),
    }
    figures = {**ratios, "reconciler_rows_per_s": out["reconciler_scan"]["rows_per_s"],
               "audit_records_per_s": out["audit_replay"]["records_per_s"]}
    targets = {k: (figures[k] is not None and figures[k] >= v) for k, v in TARGETS.items()}
    targets["latency_p99_ms"] = out["latency"]["p99_ms"] <= P99_TARGET_MS
    targets["decode_vs_fastavro"] = out["decode"]["ratio"] <= DECODE_TARGET
    targets["console_page_ms"] = out["console_pages"]["worst_ms"] <= CONSOLE_PAGE_TARGET_MS
    targets["fairness_ratio"] = bool(out["fairness"]["met"])
    stages = [*(f"lapse {r['workers']}w b{r['batch_size']}" for r in out["lapse"] if not r.get("verified")),
              *(f"transaction alone b{r['batch_size']}" for r in out["transaction_alone"] if not r.get("verified")),
              *(name for name in (*BASELINES, "db_bound", "relay") if name in out and not out[name].get("verified"))]
    return {**out, "lapse_best": {"workers": best["workers"], "batch_size": best["batch_size"],
                                  "events_per_s": best["events_per_s"]},
            "lapse_1worker_events_per_s": one["events_per_s"],
            "limit_events_per_s": round(limit, 1) if limit else None, **ratios, "unverified": stages,
            "targets_met": targets}


def _relay_rate(relay: dict[str, Any] | None) -> float | None:
    """The relay's rows/s, counted only when its end state was verified."""
    return relay["rows_per_s"] if relay and relay.get("verified") else None


def _lapse_at(runs: list[dict[str, Any]], workers: int, batch: int) -> dict[str, Any] | None:
    """The run of `workers` at `batch` from a backlog waiting at the start (not joined first)."""
    return next((r for r in runs if r["workers"] == workers and r["batch_size"] == batch
                 and not r.get("joined_first")), None)


def table(result: dict[str, Any]) -> str:
    """A person's view of the result: one line per stage, then the ratios."""
    rows = [("stage", "events", "rate/s", "note")]
    k = result["consumer"]
    rows.append(("limit: consumer alone", k["events"], k["events_per_s"], "consume + decode, no database"))
    d = result["decode"]
    rows.append(("decode + validation", d["events"], round(1e6 / d["decode_us"], 1),
                 f"{d['decode_us']} µs an event, {d['ratio']}x fastavro's own {d['fastavro_us']} µs"))
    b = result["db_bound"]
    rows.append(("limit: database lower bound", b["events"], b["events_per_s"],
                 f"{b.get('method', '')}; " + _checked(b)))
    rows.append(("limit: one worker", "", result["limit_events_per_s"], "1 / (1/consumer + 1/bound)"))
    for r in result["transaction_alone"]:
        rows.append((f"transaction alone (batch {r['batch_size']})", r["events"], r["events_per_s"],
                     "apply_batch, no Kafka; " + _checked(r)))
    for r in result["lapse"]:
        note = (f"start-up {r['startup_s']}s, offsets committed: {r['offsets_committed']}; "
                if "startup_s" in r else "") + _checked(r)
        joined = ", joined first" if r.get("joined_first") else ""
        rows.append((f"lapse: {r['workers']} worker(s), batch {r['batch_size']}{joined}", r["events"],
                     r["events_per_s"], note))
    labels = {"quix": "quix streams peer: batching sink, set-based SQL", "naive": "naive: txn + sync commit per msg",
              "faust": "faust: agent, one event at a time", "batched_naive": "batched naive: executemany per batch"}
    for name in BASELINES:
        if name in result:
            r = result[name]
            startup = f"start-up {r['startup_s']}s; " if r.get("startup_s") is not None else ""
            rows.append((labels[name], r["events"], r["events_per_s"], startup + _checked(r)))
    if "relay" in result:
        r = result["relay"]
        rows.append((f"relay: one relay, batch {r['batch_size']}", r["rows"], r["rows_per_s"],
                     "outbox → outcomes topic; " + _checked(r)))
    lat = result["latency"]
    rows.append(("latency (1 worker)", lat["events"], lat["offered_events_per_s"],
                 f"p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms, p99 {lat['p99_ms']} ms "
                 f"(observed p99 {lat['observed_p99_ms']} ms)"))
    s = result["reconciler_scan"]
    rows.append(("reconciler scan", s["rows"], s["rows_per_s"], s["method"]))
    a = result["audit_replay"]
    rows.append(("audit replay", a["records"], a["records_per_s"], a["method"]))
    f = result["fairness"]
    rows.append((f"fairness: B-E behind A's {f['backlog']:,} rows", f["small_rows"], f["backlog_rows_per_s"],
                 f"B-E done in {f['small_with_backlog_s']} s against {f['small_alone_s']} s alone: median ratio "
                 f"{f['ratio']} (target ≤ {f['target']}); the rate is A's meanwhile"))
    p = result["console_pages"]
    rows.append(("console pages (ledger rows)", p["rows"], "",
                 ", ".join(f"{name} {page['median_ms']} ms" for name, page in p["pages"].items())
                 + f"; worst {p['worst_ms']} ms (target ≤ {CONSOLE_PAGE_TARGET_MS:.0f})"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(3)]
    lines = [f"{r[0]!s:<{widths[0]}}  {r[1]!s:>{widths[1]}}  {r[2]!s:>{widths[2]}}  {r[3]}"
             for r in rows]
    lines.append("")
    for key in RATIOS:
        target = f"(target ≥ {TARGETS[key]})" if key in TARGETS else "(reference)"
        lines.append(f"{key:<24} {result[key]!s:<8} {target}")
    missed = [k for k, ok in result["targets_met"].items() if not ok]
    lines.append(f"targets missed: {', '.join(missed) if missed else 'none'}")
    if result["unverified"]:
        lines.append(f"end state not verified (not counted): {', '.join(result['unverified'])}")
    return "\n".join(lines)


def _checked(stage: dict[str, Any]) -> str:
    return "end state verified" if stage.get("verified") else f"NOT VERIFIED: {stage.get('reason')}"
