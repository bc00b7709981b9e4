"""`lapse bench`: Lapse against its limit (the consumer alone, then the database's lower bound for
the same writes), a Quix Streams peer and three reference baselines (naive, Faust, batched naive),
the fairness figure (small tenants behind a big one's backlog), and the console's pages timed on a
big ledger."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option
from lapse.shell.extras import require_extra


def _batch_sizes(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers like 100,500,2000") from None
    if not sizes or any(not 1 <= s <= 100_000 for s in sizes):
        raise click.BadParameter(f"{value!r}: each batch size must be between 1 and 100000")
    return sizes


@main.command()
@connection_options
@click.option("--events", type=click.IntRange(10, 10_000_000), default=20_000, show_default=True,
              help="Expiry events (and held reservations) per stage.")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Most worker processes for the Lapse stage (it runs 1 and this many).")
@click.option("--batch-sizes", default="100,500,2000", show_default=True, callback=_batch_sizes,
              help="Batch sizes for the Lapse and transaction-alone stages; 500 (or the middle one) "
                   "is the default run.")
@click.option("--scan-rows", type=click.IntRange(1000, 100_000_000), default=1_000_000, show_default=True,
              help="Rows in the business table of the reconciler scan.")
@click.option("--console-rows", type=click.IntRange(1000, 100_000_000), default=2_000_000, show_default=True,
              help="Ledger rows (finished, with their transitions and some dead letters) the console's "
                   "pages are timed on.")
@click.option("--fairness-backlog", type=click.IntRange(100, 10_000_000), default=100_000, show_default=True,
              help="Due rows of the tenant whose backlog the fairness stage puts before four small tenants.")
@click.option("--no-faust", is_flag=True, help="Skip the Faust baseline.")
@click.option("--quix-python", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The Python of the Quix Streams peer's own environment (`make quix-peer` makes "
                   "build/quix-venv, the default).")
@click.option("--quick", is_flag=True,
              help="A smoke-test run: 300 events, one batch size, small scan, 20,000 console ledger rows.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw throughput per stage and the latency histogram to this PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with every figure.")
@setting_option("dev.kafka_jars", type=click.Path(file_okay=False, path_type=Path),
                help="Apache Kafka server jars for the bench's own broker.")
@setting_option("dev.java_home", type=click.Path(file_okay=False, path_type=Path),
                help="The JDK for the bench's own broker (else java on PATH).")
@pass_settings
def bench(settings: Settings, events: int, workers: int, batch_sizes: tuple[int, ...], scan_rows: int,
          console_rows: int, fairness_backlog: int, no_faust: bool, quix_python: Path | None, quick: bool,
          plot_path: Path | None, as_json: bool) -> None:
    """Benchmark Lapse on Apache Kafka and PostgreSQL against its limit, a peer and honest baselines.

    Starts its own Apache Kafka from the cached jars unless --bootstrap-servers (or
    LAPSE_KAFKA__BOOTSTRAP_SERVERS) is given. Every stage runs in its own environment: a topic
    prefix of its own (its topics and groups, deleted after) and a fresh PostgreSQL database on the
    server of --database-url (default postgresql+psycopg://lapse@127.0.0.1:5432/lapse), dropped after.
    """
    # function-local: keeps `lapse --help` fast
    from sqlalchemy.exc import OperationalError

    from lapse.devtools.bench.ledger_watch import StageFailed
    from lapse.devtools.bench.report import table
    from lapse.devtools.bench.runner import BenchPlan, run_bench
    from lapse.devtools.brokers import BrokerUnavailable

    if plot_path is not None and not plot_path.parent.is_dir():
        raise click.UsageError(f"--plot: folder {plot_path.parent} does not exist")
    if quick:
        plan = BenchPlan.quick(events=min(events, 300), workers=workers, batch_sizes=batch_sizes[:1])
    else:
        plan = BenchPlan(events, workers, batch_sizes, scan_rows=scan_rows, console_rows=console_rows,
                         fairness_backlog=fairness_backlog)
    if no_faust:
        plan = replace(plan, faust=False)
    else:
        require_extra("analytics", "faust")  # the Faust baseline
    if quix_python is not None:
        plan = replace(plan, quix_python=quix_python)
    progress = (lambda msg: click.echo(f"bench: {msg}", err=True))
    try:
        result = run_bench(settings, plan, progress)
    except (BrokerUnavailable, StageFailed) as exc:
        raise click.ClickException(str(exc)) from None
    except OperationalError as exc:
        first = str(exc.orig or exc).strip().splitlines()[0]
        raise click.ClickException(f"PostgreSQL not reachable ({first}): set --database-url") from None
    if plot_path is not None:
        # function-local: keeps `lapse --help` fast
        from lapse.devtools.bench.plot import write_plot

        write_plot(result, plot_path)
    if as_json:
        result = {**result, "latency": {k: v for k, v in result["latency"].items() if k != "latencies_ms"}}
    emit(result, as_json, table)
