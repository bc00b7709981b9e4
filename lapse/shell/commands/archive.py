"""`lapse archive`: run the archive role — the expiry events, outcomes, dead letters and the ledger's
transitions written to files in an S3-compatible store or a folder — until stopped, or until idle.

Exit 0 when stopped or idle; 3 when the archive URL is malformed or its store will not take a write
(one line naming why), when topics.yaml declares no archive group, or when the ledger is not on
PostgreSQL; 4 when Kafka, the database or the store cannot be reached (`--exit-when-idle`).
"""

from __future__ import annotations

from dataclasses import asdict

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option


@main.command()
@connection_options
@setting_option("archive.url")
@setting_option("archive.endpoint_url")
@setting_option("archive.file_span_s", "--file-span")
@setting_option("runtime.metrics_port")
@click.option("--exit-when-idle", type=float, default=None, metavar="SECONDS",
              help="Close the open files and stop once every partition was read to its end and nothing "
                   "arrived for this long (default: run until stopped).")
@click.option("--json", "as_json", is_flag=True, help="Print the final counts as JSON.")
@pass_settings
def archive(settings: Settings, exit_when_idle: float | None, as_json: bool) -> None:
    """Write lapse.expiry, lapse.outcomes and lapse.dlq (group lapse-archive), and the ledger's
    transitions, to files — one per partition and file span, with a manifest of offsets and
    SHA-256 sums — at archive.url (s3://bucket/prefix or file:///folder)."""
    # function-local: keeps `lapse --help` fast
    from lapse.shell.metrics import serve
    from lapse.shell.roles import ArchiveRole, run_role

    serve(settings)
    role = ArchiveRole(settings, exit_when_idle=exit_when_idle)
    run_role(role)
    emit(asdict(role.stats), as_json, lambda d: " ".join(f"{k}={v}" for k, v in d.items()))
