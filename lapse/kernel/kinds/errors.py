"""The one error of the kinds file, always a single line: the file, the kind, the field, what is wrong.

Whatever text comes from the file (a name, a value) is shown quoted and cut short, so a hostile
or mistyped value can neither break the line nor flood the terminal.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lapse.kernel.text import one_line

_PLAIN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SHOWN_CHARS = 60


def show(value: Any, *, bare: bool = False) -> str:
    """`value` for an error message: quoted (or `bare` when it is a plain word), one line, short."""
    if bare and isinstance(value, (str, int)) and _PLAIN.match(str(value)):
        return str(value)
    return one_line(repr(value), SHOWN_CHARS + 1)


class KindsFileError(ValueError):
    """A kinds file that cannot be used, or a kind in it that is wrong; the message is one line."""


class KindError(ValueError):
    """A mistake in one kind's declaration at `field` (a dotted path such as `eligible.status`);
    `in_file` turns it into the one-line KindsFileError that names the file and the kind."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def in_file(self, path: Path | str, kind: Any) -> KindsFileError:
        return KindsFileError(f"{path}: kind {show(kind)}: {self.field}: {self.message}".replace("\n", " "))
