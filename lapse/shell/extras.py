"""The package's extras: a command that needs one that is not installed says which, in one line."""

from __future__ import annotations

import sys
from importlib.util import find_spec

import click

from lapse.shell.error_boundary import CommandFailed, ExitCode


def require_extra(extra: str, *modules: str) -> None:
    """Refuse (exit 3) the command running now when a module of the extra `extra` is missing."""
    missing = next((m for m in modules if not installed(m)), None)
    if missing is None:
        return
    ctx = click.get_current_context(silent=True)
    command = (ctx.command_path.partition(" ")[2] or ctx.command_path) if ctx is not None else "this command"
    raise CommandFailed(ExitCode.CONFIG, f"{command} needs the `{extra}` extra ({missing} is not installed): "
                                         f"pip install 'lapse[{extra}]'")


def installed(module: str) -> bool:
    """Whether `module` can be imported. One imported already counts as such: Faust replaces its
    own module with one that has no `__spec__`, and `find_spec` raises ValueError for it."""
    if sys.modules.get(module) is not None:
        return True
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False
