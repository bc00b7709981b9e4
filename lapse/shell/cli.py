"""The root `lapse` command group. Commands attach themselves to it from `lapse.shell.commands`
(and from installed `lapse.commands` entry points); `lapse.shell.app` assembles them.

Its own options: `--config FILE` (the config file every subcommand's settings read), `--debug` and
`--version`. Run as the console script, it passes through the error boundary
(`lapse.shell.error_boundary`): whatever escapes a command is one line and a documented exit code.
"""

from __future__ import annotations

from pathlib import Path

import click

from lapse.kernel.config_file import CONFIG_ENV_VAR
from lapse.shell.error_boundary import BoundedGroup, note_debug


@click.group(cls=BoundedGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Config file (TOML) under the LAPSE_* variables and flags. [env: {CONFIG_ENV_VAR}; "
                   "else ./lapse.toml when present]")
@click.option("--debug", is_flag=True, help="On an error, print its traceback above the one-line message.")
@click.version_option(package_name="lapse", message="lapse %(version)s",
                      help="Print `lapse <version>` and exit.")
def main(config_file: Path | None, debug: bool) -> None:
    """Lapse: idempotent cleanup of things that lapse, driven by Kafka."""
    if debug:
        note_debug()


def config_file_option() -> Path | None:
    """The root group's `--config`, for the command running now (None outside a command)."""
    ctx = click.get_current_context(silent=True)
    return ctx.find_root().params.get("config_file") if ctx is not None else None
