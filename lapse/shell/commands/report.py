"""`lapse report`: store the daily cleanup report of one UTC day and deliver pending final reports;
with `--serve`, run as the report role (a pass every `report.interval_s`) until stopped."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, log_options, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.time_args import Duration


def _text(r: dict[str, Any]) -> str:
    stored = ("stored" if r["enqueued"] else "already stored") + (
        " (partial: the day has not closed; rebuilt by each run until it has, sent once final)"
        if r["partial"] else "")
    line = f"{r['report_key']}: {stored}; delivered {len(r['delivered'])} via {r['notifier']}"
    if r["failed"]:
        line += f"; failed {len(r['failed'])} (retried next run): {next(iter(r['failed'].values()))}"
    return line


@main.command()
@setting_option("database.url")
@log_options
@setting_option("report.notifier", "--notifier", type=click.Choice(["file", "smtp"]))
@setting_option("report.dir", "--report-dir", type=click.Path(file_okay=False))
@click.option("--date", "day", type=click.DateTime(formats=["%Y-%m-%d"]), default=None,
              help="UTC day to report, YYYY-MM-DD (default: yesterday). A missed day is enqueued "
                   "by giving its date.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--serve", is_flag=True,
              help="Run as the report role until stopped: rebuild the open day's partial report every "
                   "report.interval_s and send each day's final report once it has closed.")
@setting_option("report.interval_s", "--interval", type=Duration(as_seconds=True), metavar="DURATION")
@setting_option("report.grace_s", "--grace", type=Duration(as_seconds=True), metavar="DURATION")
@setting_option("runtime.metrics_port")
@pass_settings
def report(settings: Settings, day: datetime | None, as_json: bool, serve: bool) -> None:
    """Store the daily report `daily-report:YYYY-MM-DD` (partial while the day is open, final once it
    has closed) and send undelivered final reports, each once."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.metrics import serve as serve_metrics
    from lapse.shell.roles import ReportRole, run_role

    if serve and day is not None:
        raise click.UsageError("give --date or --serve, not both: the report role picks its days itself")
    try:
        role = ReportRole(settings, once=not serve, day=day.date() if day else None)
    except ValueError as exc:  # a notifier without what it needs (smtp without a host)
        raise CommandFailed(ExitCode.CONFIG, str(exc)) from None
    if serve:
        serve_metrics(settings)
    done = run_role(role)
    if done is None:  # the service, stopped
        return
    emit({"report_key": done.stored.key, "enqueued": done.stored.changed, "partial": done.stored.partial,
          "delivered": done.delivered, "failed": done.failed, "notifier": role.notifier.name}, as_json, _text)
    if done.failed:
        raise SystemExit(1)
