"""`lapse analytics`: the Faust app over lapse.outcomes, its figures served as JSON over HTTP."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, pass_settings, setting_option
from lapse.shell.extras import require_extra
from lapse.shell.time_args import DURATION


@main.command()
@connection_options
@setting_option("processor.session_timeout_ms")
@click.option("--app-id", default="lapse-analytics", show_default=True,
              help="Faust app id, which is also its consumer group.")
@click.option("--web-port", type=click.IntRange(1, 65535), default=6066, show_default=True,
              help="Port of Faust's web server; the figures are at /lapse/analytics/.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".lapse/faust"), show_default=True, help="Faust's data directory.")
@click.option("--replication-factor", type=click.IntRange(1, 16), default=1, show_default=True,
              help="Replication factor of Faust's changelog topics (3 on the compose cluster).")
@click.option("--window-retention", type=DURATION, default="1h", show_default=True,
              help="How long one-minute windows are kept.")
@pass_settings
def analytics(settings: Settings, app_id: str, web_port: int, data_dir: Path, replication_factor: int,
              window_retention: timedelta) -> None:
    """Per-minute outcomes by kind and status, attempts per completion, due-to-applied latency
    (p50/p95/p99) and dead-letter growth, as a faust-streaming app (run one worker)."""
    require_extra("analytics", "faust")
    # function-local: keeps `lapse --help` fast
    from lapse.readers import AnalyticsOptions, run_analytics

    run_analytics(settings, AnalyticsOptions(app_id=app_id, web_port=web_port, data_dir=data_dir,
                                             replication_factor=replication_factor,
                                             window_retention=window_retention))
