"""The one progress bar of long commands: click's, on stderr so that stdout stays the result, and
only where stderr is a terminal (a log file or a pipe gets nothing)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar


@contextmanager
def progress_bar(label: str, length: int | None = None) -> Iterator[ProgressBar[Any]]:
    """A bar advanced by `bar.update(n, what)` (`what`: shown after it); `length` None for work
    whose size is not known (it then shows the count)."""
    with click.progressbar(iter(()), length=length, label=label, file=sys.stderr, hidden=not sys.stderr.isatty(),
                           show_pos=True,
                           show_percent=length is not None, show_eta=length is not None,
                           item_show_func=lambda what: None if what is None else str(what)) as bar:
        yield bar
