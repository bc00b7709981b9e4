"""The soak's result as text for a person: one line per reading, throughput per minute, the checks."""

from __future__ import annotations

from typing import Any


def soak_table(result: dict[str, Any]) -> str:
    lines = [f"soak: {result['minutes']:g} min at {result['rate']:.0f} events/s offered, {result['workers']} "
             f"worker(s), {result['seed_rows']:,} rows seeded, ledger horizon {result['horizon_s']:.0f} s",
             f"offered: {result['offered']}",
             f"{'elapsed':>8} {'lag':>8} {'lag s':>7} {'delay':>7} {'outbox':>7} {'tables MB':>10} "
             f"{'finished/min':>13}"]
    for s in result["samples"]:
        lines.append(f"{s['elapsed_s']:8.0f} {s['lag_records']:8d} {s['lag_s']:7.1f} {s['delay_lag_records']:7d} "
                     f"{s['outbox_unsent']:7d} {s['total_mb']:10.1f} {s['finished_per_min']:13.0f}")
    lines.append(f"finished per whole minute: {', '.join(f'{n:.0f}' for n in result['finished_per_minute']) or '-'}")
    lines.append(f"ledger rows at the end: {result['ledger_rows_at_end']:,} "
                 f"({result['seeded_rows_left']:,} seeded left)")
    for name, check in result["checks"].items():
        lines.append(f"{'ok  ' if check['ok'] else 'FAIL'} {name}: {check['detail']}")
    lines.append("steady" if result["ok"] else "NOT steady")
    return "\n".join(lines)
