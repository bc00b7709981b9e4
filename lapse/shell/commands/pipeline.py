"""`lapse sweep`, `lapse process`, `lapse relay`, `lapse run`: the pipeline's long-running jobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option
from lapse.shell.commands.kinds import kinds_file_errors
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.signals import stop_on_signals
from lapse.shell.time_args import Duration


def _exit_when_idle() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--exit-when-idle", type=Duration(as_seconds=True), default=None, metavar="DURATION",
                        help="Stop after this long with nothing to do, e.g. 30s (default: run until stopped).")


@main.command()
@connection_options
@setting_option("producer.sweep_page_size", "--page-size")
@setting_option("producer.sweep_interval_s", "--interval")
@setting_option("runtime.metrics_port")
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_settings
def sweep(settings: Settings, once: bool, as_json: bool) -> None:
    """Emit expiry events for due business rows that have no ledger row yet."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.metrics import serve
    from lapse.shell.roles import SweepRole, run_role

    if not once:
        serve(settings)
    with kinds_file_errors():
        report = run_role(SweepRole(settings, once=once))
    if report is not None:
        emit(asdict(report), as_json,
             lambda r: f"swept {r['pages']} pages: {r['found']} due, {r['emitted']} events emitted"
                       + (f"; {r['unkeyable']} due rows set aside, their ids cannot form an op key"
                          if r["unkeyable"] else ""))


@main.command()
@connection_options
@setting_option("processor.batch_size")
@setting_option("processor.session_timeout_ms")
@setting_option("runtime.metrics_port")
@_exit_when_idle()
@click.option("--json", "as_json", is_flag=True, help="Print the final counts as JSON.")
@pass_settings
def process(settings: Settings, exit_when_idle: float | None, as_json: bool) -> None:
    """Consume lapse.expiry in group lapse-cleanup and apply each cleanup once."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.metrics import serve
    from lapse.shell.roles import ProcessRole, run_role

    serve(settings)
    role = ProcessRole(settings, exit_when_idle=exit_when_idle)
    with kinds_file_errors():
        run_role(role)
    data = {k: v for k, v in asdict(role.stats).items() if k != "started"}
    emit(data, as_json, lambda d: " ".join(f"{k}={v}" for k, v in d.items()))


@main.command()
@connection_options
@setting_option("producer.relay_batch_size", "--batch-size")
@setting_option("runtime.metrics_port")
@_exit_when_idle()
@pass_settings
def relay(settings: Settings, exit_when_idle: float | None) -> None:
    """Publish outbox rows (outcomes, dead letters) to Kafka in order."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.metrics import serve
    from lapse.shell.roles import RelayRole, run_role

    serve(settings)
    total = run_role(RelayRole(settings, exit_when_idle=exit_when_idle)) or 0
    click.echo(f"relayed {total} outbox rows")


@main.command()
@connection_options
@setting_option("runtime.metrics_port", help="Serve every role's metrics and the status samples on this one port.")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Processor processes.")
@click.option("--console", "with_console", is_flag=True,
              help="Also serve the operator console (console.bind, console.port; the `console` extra).")
@pass_settings
def run(settings: Settings, workers: int, with_console: bool) -> None:
    """Run sweep, processors, relay, delay tiers, reconciler, daily report and prune (with --console
    the operator console, and the archive when archive.url is set) in one process tree until
    interrupted; a role that dies is restarted."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.roles import pipeline_roles, when_reachable
    from lapse.shell.supervisor import Supervisor

    if with_console:
        # function-local: the console's access rules load only with --console
        from lapse.shell.console.access import Access

        try:
            Access(settings.console).check_bind(settings.console.bind)
        except ValueError as exc:  # no tokens and a bind beyond this host: not a role to restart forever
            raise CommandFailed(ExitCode.CONFIG, str(exc)) from None
    # The status samples (oldest eligible age, ledger, outbox, lag) are read by the supervisor's
    # metrics endpoint when scraped: no monitor role.
    archive = settings.archive.url is not None
    sup = Supervisor(settings, pipeline_roles(workers, console=with_console, archive=archive))
    stop_on_signals(sup.stop, hurry=sup.hurry)  # SIGTERM/Ctrl-C: stop; a second one: no more grace
    # Refused here, in one line, rather than by every role in a restart loop; a dependency away at
    # start is waited for, as each role would.
    with kinds_file_errors():
        if when_reachable("run", sup.stop, lambda: _checked(settings, archive=archive), settings) is None:
            return  # stopped before the dependencies came back
    sup.start()
    try:
        sup.watch()
    finally:
        killed = sup.shutdown()
    if killed:
        hurried = " (a second signal ended the grace)" if sup.hurry.is_set() else ""
        raise CommandFailed(ExitCode.INTERRUPTED, f"run: killed {', '.join(killed)}: not stopped within "
                            f"{sup.grace_s:g} s of SIGTERM{hurried}")


def _checked(settings: Settings, *, archive: bool) -> bool:
    """The start-up checks, the kinds compiled against the database and a broker that answers, as
    every role makes them; with `archive`, the archive role's own (its URL, its store taking a write)."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.kinds import load_kinds
    from lapse.shell.roles import ArchiveRole
    from lapse.shell.startup_checks import check_kafka, check_startup

    check_startup(settings)
    engine = engine_from_settings(settings)
    try:
        load_kinds(settings, engine)
    finally:
        engine.dispose()
    check_kafka(settings)
    if archive:
        role = ArchiveRole(settings)
        try:
            role.check()
        finally:
            role.close()
    return True
