"""`lapse prune`: remove finished work older than its horizons in bounded batches (on PostgreSQL,
rotating time partitions); `--dry-run` counts and says why, `--watch` runs the prune role."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.time_args import Duration

# Long work reports progress on stderr at most this often (stdout stays the result).
PROGRESS_EVERY_S = 2.0


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


class _Progress:
    """Prints `table: n removed` to stderr once a pass has run a while, then at most every few seconds."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()

    def __call__(self, table: str, removed: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            sys.stderr.write(f"prune: {table} {removed} removed so far ({now - self.started:.0f}s)\n")
            sys.stderr.flush()


@main.command()
@setting_option("database.url")
@setting_option("topics.file")
@setting_option("topics.prefix")
@setting_option("runtime.log_level")
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

    try:
        role = PruneRole(settings, once=not watch, dry_run=dry_run, progress=None if watch else _Progress())
    except HorizonRefused as exc:
        raise CommandFailed(ExitCode.CONFIG, str(exc)) from None
    if watch and dry_run:
        raise click.UsageError("--watch removes rows; a dry run is one pass")
    report = run_role(role)
    if report is not None:
        emit(report.to_dict(), as_json, _text)
