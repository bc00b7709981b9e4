"""`lapse db`: the ledger database's schema."""

from __future__ import annotations

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, pass_settings


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@connection_options
@pass_settings
def db_upgrade(settings: Settings) -> None:
    """Apply the Alembic migrations to the configured database."""
    from lapse.kernel.database import upgrade  # function-local: keeps `lapse --help` fast

    upgrade(settings)
    click.echo("database at head")
