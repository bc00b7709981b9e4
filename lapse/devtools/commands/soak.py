"""`lapse soak`: minutes of steady load over a pre-seeded ledger with pruning running, and whether
lag, outbox backlog, table sizes and throughput held steady."""

from __future__ import annotations

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode


@main.command()
@connection_options
@click.option("--minutes", type=click.FloatRange(0.1, 24 * 60), default=10.0, show_default=True,
              help="How long the load is offered.")
@click.option("--rate", type=click.FloatRange(1, 100_000), default=300.0, show_default=True,
              help="Events offered per second (a mix of expiring, paid, extended holds, export files, poison).")
@click.option("--seed-rows", type=click.IntRange(0, 100_000_000), default=2_000_000, show_default=True,
              help="Finished ledger rows seeded before the run, all past the retention horizon.")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Cleanup worker processes among `lapse run`'s roles.")
@click.option("--sample-s", type=click.FloatRange(1, 600), default=60.0, show_default=True,
              help="Seconds between readings.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with every reading and check.")
@setting_option("dev.kafka_jars", type=click.Path(file_okay=False),
                help="Apache Kafka server jars for the soak's own broker.")
@setting_option("dev.java_home", type=click.Path(file_okay=False),
                help="The JDK for the soak's own broker (else java on PATH).")
@pass_settings
def soak(settings: Settings, minutes: float, rate: float, seed_rows: int, workers: int, sample_s: float,
         as_json: bool) -> None:
    """Offer a steady load to `lapse run`'s roles over a pre-seeded ledger, with pruning running.

    Starts its own Apache Kafka from the cached jars unless --bootstrap-servers is given, and
    works in a fresh PostgreSQL database on the server of --database-url, dropped afterwards.
    Exits 1 when a check fails: lag or outbox backlog growing over the last half, table sizes
    growing, or the last minute's throughput under 90% of the first's.
    """
    # function-local: keeps `lapse --help` fast
    from lapse.devtools.soak import SoakPlan, run_soak
    from lapse.devtools.soak.report import soak_table

    progress = (lambda msg: click.echo(f"soak: {msg}", err=True))
    result = run_soak(settings, SoakPlan(minutes, rate, seed_rows, workers, sample_s), progress)
    emit(result, as_json, soak_table)
    if not result["ok"]:
        failed = ", ".join(name for name, check in result["checks"].items() if not check["ok"])
        raise CommandFailed(ExitCode.PROBLEM_FOUND, f"the soak did not hold steady: {failed}")
