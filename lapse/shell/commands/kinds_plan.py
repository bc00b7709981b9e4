"""`lapse kinds plan [KIND]`: what a kind of the kinds file would change now and over the next 24
hours, read before it is live (lapse.kernel.kinds.plan); nothing is written."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli_options import emit, log_options, pass_settings, setting_option
from lapse.shell.commands.kinds import kinds, kinds_file_errors, topology_or_none
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.time_args import TIMESTAMP_FORMS, Timestamp

# The bounds of lapse.kernel.kinds.plan, repeated here so `lapse --help` need not import it (the
# unit tests check they agree).
MAX_CAP = 100_000_000
MAX_SAMPLE = 1_000
DEFAULT_CAP = 1_000_000
DEFAULT_SAMPLE = 10
DEFAULT_TIMEOUT_S = 30.0
SHOWN_KINDS = 20


def _count(c: dict[str, Any]) -> str:
    return f"{c['rows']}+" if c["capped"] else str(c["rows"])


def _tenants(t: dict[str, Any]) -> str:
    top = ", ".join(f"{e['tenant']} {e['rows']}" for e in t["top"]) or "-"
    more = f" (of {t['tenants']}{'+' if t['capped'] else ''} tenants)" if t["tenants"] > len(t["top"]) else ""
    return top + more


def _would(would: dict[str, Any]) -> str:
    parts = []
    for action, what in would.items():
        if action in ("set", "then_set"):
            parts.append(f"{action} " + ", ".join(f"{col} {old!r} -> {new!r}" for col, (old, new) in what.items()))
        elif action == "delete":
            parts.append("delete the row")
        elif isinstance(what, dict):
            parts.append(f"{action} " + " ".join(f"{k}={v}" for k, v in what.items()))
        else:
            parts.append(f"{action}: {what}")
    return "; ".join(parts)


def plan_text(data: dict[str, Any]) -> str:
    lines: list[str] = []
    for p in data["kinds"]:
        lines.append(f"{p['kind']}: {p['effect']} on {p['table']} (index {p['due_index']}) at {p['now']}")
        lines.append(f"  eligible {_count(p['eligible'])}   due now {_count(p['due_now'])}   "
                     f"due in the next 24 h {p['next_24h']}{'+' if any(h['capped'] for h in p['hours']) else ''}")
        hours = [f"+{i}h {_count(h)}" for i, h in enumerate(p["hours"])]
        lines += ["  per hour  " + "  ".join(hours[i:i + 8]) for i in range(0, len(hours), 8)]
        lines.append(f"  tenants now: {_tenants(p['tenants']['now'])}")
        lines.append(f"  tenants next 24 h: {_tenants(p['tenants']['next_24h'])}")
        for row in p["sample"]:
            lines.append(f"  {row['op_key']}  tenant {row['tenant']}  due {row['due_at']}: {_would(row['would'])}")
        if "shadow" in p:
            lines += _shadow_text(p["shadow"])
    return "\n".join(lines) or f"no kinds in {data['file']}"


def _shadow_text(s: dict[str, Any]) -> list[str]:
    """The shadow run's results under a kind's preview (`--compare`)."""
    if not s["total"]:
        return ["  shadow: nothing recorded (the kind has not run in shadow mode)"]
    outcomes = ", ".join(f"{name} {n}" for name, n in s["by_outcome"].items())
    tenants = ", ".join(f"{t['tenant']} {t['rows']}" for t in s["tenants"]) or "-"
    lines = [f"  shadow: {s['total']}{'+' if s['capped'] else ''} operations recorded ({outcomes}); "
             f"tenants: {tenants}"]
    for e in s["latest"]:
        lines.append(f"  shadow {e['op_key']}  tenant {e['tenant']}  at {e['at']}: would {e['outcome']}: "
                     f"{_would(e['would'])}")
    return lines


@kinds.command("plan")
@click.argument("kind", required=False)
@click.option("--limit", type=click.IntRange(0, MAX_SAMPLE), default=DEFAULT_SAMPLE, show_default=True,
              help="Sample rows shown per kind, with what the effect would do to each.")
@click.option("--cap", type=click.IntRange(1, MAX_CAP), default=DEFAULT_CAP, show_default=True,
              help="Rows each count reads at most; a count that reaches it is shown as N+.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, 3600, min_open=True), default=DEFAULT_TIMEOUT_S,
              show_default=True, help="Statement timeout of the preview's reads, in seconds.")
@click.option("--at", "at", type=Timestamp(), default=None,
              help=f"Preview as of this time ({TIMESTAMP_FORMS}) instead of the database's clock.")
@click.option("--compare", is_flag=True,
              help="Show next to each preview what the kind's shadow run recorded (mode: shadow).")
@setting_option("database.url")
@setting_option("kinds.file", "--kinds-file")
@log_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_settings
def plan(settings: Settings, kind: str | None, limit: int, cap: int, timeout_s: float, at: datetime | None,
         compare: bool, as_json: bool) -> None:
    """Preview what KIND (or every kind) of the kinds file would change: rows due now and in each of
    the next 24 hours, per tenant, and a sample with the values it would set. Read-only, bounded
    by --cap and --timeout, along the kind's due index (a table without one is refused); point
    --kinds-file at a file that is not live yet to preview a change before deploying it."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.brakes import shadow_results
    from lapse.kernel.database import DatabaseNotConfigured, engine_from_settings
    from lapse.kernel.kinds import KindsFile, compile_kinds, read_kinds_file
    from lapse.kernel.kinds.errors import show
    from lapse.kernel.kinds.plan import PlanOptions, PlanRefused, plan_kinds

    with kinds_file_errors():
        kinds_file = read_kinds_file(settings.kinds.file)
    names = list(kinds_file.kinds)
    if kind is not None and kind not in kinds_file.kinds:
        known = ", ".join(names[:SHOWN_KINDS]) + (", …" if len(names) > SHOWN_KINDS else "")
        raise CommandFailed(ExitCode.USAGE, f"kinds plan: no kind {show(kind)} in {kinds_file.path} "
                                            f"(its kinds: {known or 'none'})")
    chosen = KindsFile(kinds_file.path, {n: d for n, d in kinds_file.kinds.items() if kind in (None, n)})
    try:
        engine = engine_from_settings(settings)
    except DatabaseNotConfigured as exc:
        raise click.UsageError(str(exc)) from None
    try:
        with kinds_file_errors():
            compiled = compile_kinds(chosen, engine, settings.database.schema_name, topology_or_none(settings))
        try:
            plans = plan_kinds(engine, list(compiled.values()),
                               PlanOptions(cap=cap, sample=limit, timeout_s=timeout_s), now=at)
        except PlanRefused as exc:
            raise CommandFailed(ExitCode.CONFIG, str(exc.in_file(kinds_file.path, exc.kind))) from None
        shown = [p.to_dict() for p in plans]
        if compare:
            with engine.connect() as conn:
                for p in shown:
                    p["shadow"] = shadow_results(conn, p["kind"], latest=limit).to_dict()
    finally:
        engine.dispose()
    emit({"file": str(kinds_file.path), "kinds": shown}, as_json, plan_text)
