"""The `lapse` command: one entry point, one subcommand per job.

Each room registers its commands in its own `commands` module; this file only assembles them.
"""

from __future__ import annotations

import click

from lapse.cli_options import connection_options, pass_settings


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def main() -> None:
    """Lapse: idempotent cleanup of things that lapse, driven by Kafka."""


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@connection_options
@pass_settings
def db_upgrade(settings) -> None:
    """Apply the Alembic migrations to the configured database."""
    from lapse.database import upgrade

    upgrade(settings)
    click.echo("database at head")


def _register() -> None:
    # Each import adds its commands to `main`; keep one line per room.
    import lapse.commands  # noqa: F401


_register()
