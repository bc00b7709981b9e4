"""`lapse report`: enqueue the daily cleanup report of one UTC day and deliver pending reports."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode


def _text(r: dict[str, Any]) -> str:
    stored = "stored" if r["enqueued"] else "already stored"
    line = f"{r['report_key']}: {stored}; delivered {len(r['delivered'])} via {r['notifier']}"
    if r["failed"]:
        line += f"; failed {len(r['failed'])} (retried next run): {next(iter(r['failed'].values()))}"
    return line


@main.command()
@setting_option("database.url")
@setting_option("runtime.log_level")
@setting_option("report.notifier", "--notifier", type=click.Choice(["file", "smtp"]))
@setting_option("report.dir", "--report-dir", type=click.Path(file_okay=False))
@click.option("--date", "day", type=click.DateTime(formats=["%Y-%m-%d"]), default=None,
              help="UTC day to report, YYYY-MM-DD (default: yesterday). A missed day is enqueued "
                   "by giving its date.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_settings
def report(settings: Settings, day: datetime | None, as_json: bool) -> None:
    """Store the daily report `daily-report:YYYY-MM-DD` once and send undelivered reports."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.reconciler.daily_report import deliver_pending, enqueue_report
    from lapse.reconciler.notifiers import notifier_from_settings

    try:
        notifier = notifier_from_settings(settings)
    except ValueError as exc:  # a notifier without what it needs (smtp without a host)
        raise CommandFailed(ExitCode.CONFIG, str(exc)) from None
    now = datetime.now(UTC)
    target = day.date() if day else (now - timedelta(days=1)).date()
    engine = engine_from_settings(settings)
    try:
        key, created = enqueue_report(engine, target, now)
        result = deliver_pending(engine, notifier, now)
    finally:
        engine.dispose()
    emit({"report_key": key, "enqueued": created, "delivered": result.delivered,
          "failed": result.failed, "notifier": notifier.name}, as_json, _text)
    if result.failed:
        raise SystemExit(1)
