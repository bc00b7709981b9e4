"""`lapse status`: the ledger, the alarm signals and consumer lag, for a person or a monitor."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option


def _members(state: dict[str, Any] | None) -> str:
    if not state:
        return ""
    if "error" in state:
        return f" (group not described: {state['error']})"
    return f" ({state['state']}, {state['members']} members)"


def _text(r: dict[str, Any]) -> str:
    estimated = set(r.get("ledger_estimated", ()))
    lines = ["ledger:" + (" (~: estimated)" if estimated else "")]
    for state, kinds in r["ledger"].items():
        mark = "~" if state in estimated else ""
        lines.append(f"  {state:<16} " + " ".join(f"{k}={mark}{n}" for k, n in kinds.items()))
    for kind, work in (r.get("eligible") or {}).items():
        more = "+" if work["capped"] else ""
        oldest = "" if work["oldest_due_age_s"] is None else f", oldest due {work['oldest_due_age_s']:.0f}s ago"
        per = f" (generation {work['generation']})" if work.get("generation") else ""
        lines.append(f"eligible {kind}{per}: {work['rows']}{more} rows left{oldest}")
    age = r["oldest_eligible_age_s"]
    lines.append(f"oldest eligible unfinished: {'none' if age is None else f'{age:.0f}s'}")
    claims = r["expired_claims"]
    lines.append(f"expired claims: {claims['count']}" + (
        f" (oldest expired {claims['oldest_expired_for_s']:.0f}s ago)" if claims["count"] else ""))
    lines.append(f"dead letters: {r['dead_letters']}")
    lines += _brakes_text(r.get("brakes") or {})
    lines += _limits_text(r.get("limits") or {})
    outbox = r["outbox"]
    lines.append(f"outbox unsent: {outbox['unsent']}" + (
        f" (oldest written {outbox['oldest_unsent_age_s']:.0f}s ago)" if outbox["unsent"] else ""))
    for row in r.get("lag", []):
        if "error" in row:
            lines.append(f"lag {row['group']} on {row['topic']}: {row['error']}")
        else:
            lines.append(f"lag {row['group']} on {row['topic']}: {row['records']} records, "
                         f"{row['seconds']:.0f}s{_members(row.get('group_state'))}")
    outside = {table: n for table, n in (r.get("outside_partitions") or {}).items() if n}
    if outside:
        lines.append("rows outside every time partition: " + ", ".join(
            f"{table} {n:,}{'+' if n >= 10_000 else ''}" for table, n in outside.items())
            + " (`lapse prune` creates the partitions ahead)")
    found = r.get("findings") or {}
    for circuit in found.get("open_circuits", []):
        lines.append(f"circuit {circuit['subject']}: {circuit['summary']} (until {circuit['until']})")
    for role, what in (("reconciler", "reconciler's last pass"), ("audit", "last audit")):
        if found.get(role):
            lines.append(f"{what} at {found[role]['at']}: {found[role]['summary']}")
    if found.get("archive"):
        archive = found["archive"]
        lines.append(f"archive of transitions: up to {archive['details']['archived_until']} "
                     f"({archive['lag_s']:.0f}s behind the database's clock; on the topics, the archive group's lag "
                     "above)")
    for clock in found.get("clocks", []):
        skew, bound = clock["details"]["skew_s"], clock["details"]["bound_s"]
        far = f", beyond the bound of {bound:g}s: fix its time synchronisation" if abs(skew) > bound else ""
        lines.append(f"clock {clock['subject']}: {skew:+.1f}s against the database (measured {clock['at']}){far}")
    return "\n".join(lines)


def _brakes_text(b: dict[str, Any]) -> list[str]:
    lines = []
    for p in b.get("pauses", []):
        target = p["kind"] + (f"/{p['tenant']}" if p["tenant"] else "")
        lines.append(f"paused {target} ({p['cause']}) since {p['since']} by {p['actor']}: {p['reason']}; "
                     f"{p['waiting']} operations wait")
    for kind, n in b.get("undeclared", {}).items():
        lines.append(f"undeclared kind {kind}: {n} operations held until the kinds file declares it again")
    for kind, n in b.get("shadowed", {}).items():
        lines.append(f"shadow {kind}: {n} operations shadowed (`lapse kinds plan {kind} --compare`)")
    return lines


def _limits_text(limits: dict[str, Any]) -> list[str]:
    lines = []
    for r in limits.get("routes", []):
        route = r["kind"] + (f" {r['route']}" if r["route"] else "")
        slots = f", {r['slots_held']}/{r['concurrency']} in flight" if r["concurrency"] else ""
        blocked = f", stopped {r['blocked_for_s']:.0f}s more by a Retry-After" if r["blocked_for_s"] else ""
        lines.append(f"limit {route}: {r['rate_per_s']:g} of {r['ceiling_per_s']:g} calls/s{slots}{blocked}")
    for e in limits.get("endpoints", []):
        where = e["endpoint"] or "(its own effect)"
        lines.append(f"calls {e['kind']} to {where}: {e['in_flight']} in flight, {e['calls_per_minute']:g}/min, "
                     f"429s {e['throttled_per_minute']:g}/min ({e['throttled_share']:.1%}), waited "
                     f"{e['wait_s_avg'] * 1000:.0f} ms for a slot, {e['call_s_avg'] * 1000:.0f} ms in the call")
    return lines


@main.command()
@connection_options
@setting_option("runtime.metrics_port", help="With --watch: serve the status gauges to Prometheus here.")
@click.option("--watch", type=click.FloatRange(min=1), metavar="SECONDS",
              help="Keep running, refreshing the Prometheus gauges every SECONDS (a monitor service).")
@click.option("--no-lag", is_flag=True, help="Only the ledger; do not ask Kafka for consumer lag.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@pass_settings
def status(settings: Settings, watch: float | None, no_lag: bool, as_json: bool) -> None:
    """Ledger counts by state and kind (applied and skipped estimated, marked ~, on a large
    PostgreSQL ledger), the oldest eligible-but-unfinished operation, expired claims, dead
    letters, what the brakes hold (pauses, undeclared kinds, shadow runs), the call limits (each
    route's rate and slots, each endpoint's calls, 429s and waits over the last minute) and the
    lag of every group declared in topics.yaml."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.readers import status_report

    if watch is not None:
        # function-local: keeps `lapse --help` fast
        from lapse.shell.metrics import monitor, serve
        from lapse.shell.signals import stop_on_signals

        if settings.runtime.metrics_port is None:
            raise click.UsageError("--watch needs --metrics-port (or LAPSE_RUNTIME__METRICS_PORT)")
        stop = stop_on_signals()
        serve(settings)
        monitor(settings, stop, watch)
        return
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.kafka_logs import leave_connection_failures_to_caller

    # An unreachable database or broker is the error boundary's one line (exit 4), not a report.
    leave_connection_failures_to_caller()
    engine = engine_from_settings(settings)
    try:
        report = status_report(settings, engine, datetime.now(UTC), lag=not no_lag)
    finally:
        engine.dispose()
    emit(report, as_json, _text)
