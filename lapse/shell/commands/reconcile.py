"""`lapse reconcile`: rescan for lapsed work that never produced an event or got stuck."""

from __future__ import annotations

from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option
from lapse.shell.commands.kinds import kinds_file_errors
from lapse.shell.time_args import Duration


def _summary(r: dict[str, Any]) -> str:
    gaps = ", ".join(f"{k}={v}" for k, v in sorted(r["gaps"].items())) or "none"
    anomalies = ", ".join(f"{k}={v}" for k, v in sorted(r["anomalies"].items())) or "none"
    return (f"scanned {r['scanned']} business rows and {r['ledger_scanned']} ledger rows; "
            f"gaps: {gaps}; re-emitted {r['reemitted']}; anomalies: {anomalies}")


@main.command()
@connection_options
@setting_option("reconciler.grace_s", "--grace", type=Duration(as_seconds=True), metavar="DURATION",
                help="Leave work alone until it has looked stuck this long (30s, 5m, 1h).")
@setting_option("reconciler.page_size", "--page-size", type=click.IntRange(1, 100_000))
@setting_option("reconciler.rate", "--rate", type=click.FloatRange(min=0, min_open=True),
                help="Most events re-emitted per second.")
@setting_option("reconciler.interval_s", "--interval", type=Duration(as_seconds=True), metavar="DURATION")
@setting_option("runtime.metrics_port")
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass summary as JSON.")
@pass_settings
def reconcile(settings: Settings, once: bool, as_json: bool) -> None:
    """Re-emit eligible work with no ledger row or stuck past the grace period; report anomalies."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.metrics import serve
    from lapse.shell.roles import ReconcileRole, run_role

    if not once:
        serve(settings)
    with kinds_file_errors():
        report = run_role(ReconcileRole(settings, once=once))
    if report is not None:
        emit(report.to_dict(), as_json, _summary)
