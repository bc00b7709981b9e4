"""`lapse delay`: forward delay-tier records to lapse.expiry when they are due."""

from __future__ import annotations

import click

from lapse.cli import main
from lapse.cli_options import connection_options, emit, pass_settings, setting_option


@main.command()
@connection_options
@setting_option("delay_group", "--group")
@setting_option("session_timeout_ms")
@setting_option("metrics_port")
@click.option("--json", "as_json", is_flag=True, help="Print the final count as JSON.")
@pass_settings
def delay(settings, as_json: bool) -> None:
    """Consume every lapse.delay.<tier> topic in group lapse-delay; hold each partition until its
    head record is due, then forward it to its target topic (lapse.expiry)."""
    from lapse.metrics import serve
    from processors.delay_worker import DelayWorker
    from processors.worker import install_signal_handlers

    serve(settings)
    worker = DelayWorker(settings)
    install_signal_handlers(worker.stop)
    forwarded = worker.run()
    emit({"forwarded": forwarded}, as_json, lambda d: f"forwarded {d['forwarded']} delayed records")
