"""The `lapse` console entry point: the root group with every command registered on it.

The shell's own commands register when `lapse.shell.commands` is imported; the dev tools (a layer
above the shell, which the shell never imports) register theirs through the `lapse.commands`
entry point group, and `--help` lists those in a section of their own.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import lapse.shell.commands  # noqa: F401 - registers every shell command on `main`
from lapse.shell.cli import LapseGroup, main

_OWN = set(main.commands)
for _entry in entry_points(group="lapse.commands"):
    _entry.load()
LapseGroup.dev_tools = set(main.commands) - _OWN

__all__ = ["main"]
