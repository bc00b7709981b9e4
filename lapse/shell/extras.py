"""The package's extras: a command that needs one that is not installed says which, in one line."""

from __future__ import annotations

from importlib.util import find_spec

import click

from lapse.shell.error_boundary import CommandFailed, ExitCode


def require_extra(extra: str, *modules: str) -> None:
    """Refuse (exit 3) the command running now when a module of the extra `extra` is missing."""
    missing = next((m for m in modules if find_spec(m) is None), None)
    if missing is None:
        return
    ctx = click.get_current_context(silent=True)
    command = (ctx.command_path.partition(" ")[2] or ctx.command_path) if ctx is not None else "this command"
    raise CommandFailed(ExitCode.CONFIG, f"{command} needs the `{extra}` extra ({missing} is not installed): "
                                         f"pip install 'lapse[{extra}]'")
