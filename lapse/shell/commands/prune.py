"""`lapse prune`: remove finished work older than its horizons in bounded batches (on PostgreSQL,
rotating time partitions); `--dry-run` counts and says why, `--watch` runs the prune role."""

from __future__ import annotations

from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, log_options, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.progress import progress_bar
from lapse.shell.time_args import Duration


def _text(r: dict[str, Any]) -> str:
    # function-local: keeps `lapse --help` fast
    from lapse.retention import duration_text

    verb = "would remove" if r["dry_run"] else "removed"
    lines = []
    for table, t in r["tables"].items():
        n = t["would_remove" if r["dry_run"] else "removed"]
        horizon = "forever" if t["horizon_s"] is None else duration_text(t["horizon_s"])
        lines.append(f"{table:<20} {verb} {n:>10}  horizon {horizon}: {t['reason']}")
    for table, p in r.get("partitions", {}).items():
        lines.append(_partitions_text(table, p, r["dry_run"]))
    tail = f"total {verb} {r['total']}"
    if not r["dry_run"]:
        tail += f" in {r['batches']} batches" + (" (stopped early)" if r["stopped"] else "")
    return "\n".join([*lines, tail])


def _partitions_text(table: str, p: dict[str, Any], dry_run: bool) -> str:
    """One table's partition work: created and dropped (rows estimated), pinned and skipped ones
    with the reason, and what waits in its DEFAULT partition."""
    create, drop = ("would create", "would drop") if dry_run else ("created", "dropped")
    names = ", ".join
    parts = [f"{create} {names(p['create']) or 'none'}",
             f"{drop} " + (names(f"{d['name']} ({_rows(d['rows_estimate'])})" for d in p["drop"]) or "none")]
    parts += [f"kept {x['name']}: {x['reason']}" for x in p["pinned"]]
    parts += [f"left for the next pass {x['name']} ({x['action']}): {x['reason']}" for x in p["skipped"]]
    if p["moved_from_default"]:
        parts.append(f"moved {p['moved_from_default']} rows out of DEFAULT")
    parts.append(f"{_rows(p['default_rows_estimate'])} in DEFAULT")
    return f"{table + ' partitions':<20} " + "; ".join(parts)


def _rows(estimate: int | None) -> str:
    return "rows not estimated yet" if estimate is None else f"~{estimate} rows"


@main.command()
@setting_option("database.url")
@setting_option("topics.file")
@setting_option("topics.prefix")
@log_options
@setting_option("retention.ledger_horizon_s", "--ledger-horizon", type=Duration(as_seconds=True),
                metavar="DURATION", help="Keep applied and skipped rows this long (default: derived from topics.yaml).")
@setting_option("retention.dead_letter_horizon_s", "--dead-letter-horizon", type=Duration(as_seconds=True),
                metavar="DURATION", help="Keep dead letters this long (default: derived from topics.yaml).")
@setting_option("retention.outbox_horizon_s", "--outbox-horizon", type=Duration(as_seconds=True),
                metavar="DURATION")
@setting_option("retention.history_horizon_s", "--history-horizon", type=Duration(as_seconds=True),
                metavar="DURATION", help="Keep transitions this long on PostgreSQL (default: the dead-letter horizon).")
@setting_option("retention.batch_size", "--batch-size", type=click.IntRange(1, 100_000))
@setting_option("retention.interval_s", "--interval", type=Duration(as_seconds=True), metavar="DURATION")
@click.option("--dry-run", is_flag=True, help="Count what would be removed, per table, list the partitions that "
              "would be created and dropped, and change nothing.")
@click.option("--watch", is_flag=True, help="Keep pruning, a pass every --interval, until stopped (a service).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_settings
def prune(settings: Settings, dry_run: bool, watch: bool, as_json: bool) -> None:
    """Remove finished work older than its retention horizon (one pass, or a pass every interval)."""
    # function-local: keeps `lapse --help` fast
    from lapse.retention import HorizonRefused
    from lapse.shell.roles import PruneRole, run_role

    if watch and dry_run:
        raise click.UsageError("--watch removes rows; a dry run is one pass")
    try:
        role = PruneRole(settings, once=not watch, dry_run=dry_run)
    except HorizonRefused as exc:
        raise CommandFailed(ExitCode.CONFIG, str(exc)) from None
    if watch or dry_run:
        report = run_role(role)
    else:
        removed: dict[str, int] = {}  # table → rows removed from it so far in this pass
        with progress_bar("prune") as bar:
            def advance(table: str, so_far: int) -> None:
                bar.update(so_far - removed.get(table, 0), table)
                removed[table] = so_far

            role.progress = advance
            report = run_role(role)
    if report is not None:
        emit(report.to_dict(), as_json, _text)
