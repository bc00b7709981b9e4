"""The root `lapse` command group. Commands attach themselves to it from `lapse.shell.commands`
(and from installed `lapse.commands` entry points); `lapse.shell.app` assembles them.

Its own options: `--config FILE` (the config file every subcommand's settings read), `--debug` and
`--version`. Run as the console script, it passes through the error boundary
(`lapse.shell.error_boundary`): whatever escapes a command is one line and a documented exit code.
`--help` lists the operator's commands, then the dev tools in a section of their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import click

from lapse.kernel.config_file import CONFIG_ENV_VAR
from lapse.shell.error_boundary import BoundedGroup, note_debug

SECTIONS = ("Commands", "Dev tools")


class LapseGroup(BoundedGroup):
    """The root group: `dev_tools` names the commands `--help` lists in their own section (those
    the `lapse.commands` entry points registered, `lapse.shell.app` says which)."""

    dev_tools: ClassVar[set[str]] = set()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown = [(name, cmd) for name in self.list_commands(ctx)
                 if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if not shown:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in shown)
        for section in SECTIONS:
            rows = [(name, cmd.get_short_help_str(limit)) for name, cmd in shown
                    if (name in self.dev_tools) == (section == "Dev tools")]
            if rows:
                with formatter.section(section):
                    formatter.write_dl(rows)


@click.group(cls=LapseGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
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
