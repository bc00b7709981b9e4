"""`lapse delay`: forward delay-tier records to lapse.expiry when they are due."""

from __future__ import annotations

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option


@main.command()
@connection_options
@setting_option("processor.session_timeout_ms")
@setting_option("runtime.metrics_port")
@click.option("--json", "as_json", is_flag=True, help="Print the final count as JSON.")
@pass_settings
def delay(settings: Settings, as_json: bool) -> None:
    """Consume every lapse.delay.<tier> topic in group lapse-delay; hold each partition until its
    head record is due, then forward it to its target topic (lapse.expiry)."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.metrics import serve
    from lapse.shell.roles import DelayRole, run_role

    serve(settings)
    forwarded = run_role(DelayRole(settings)) or 0
    emit({"forwarded": forwarded}, as_json, lambda d: f"forwarded {d['forwarded']} delayed records")
