"""The progress bar of long commands: drawn on a terminal, nothing at all on a pipe or a file."""

from __future__ import annotations

import io
import os
import pty
import select
import sys

import pytest

from lapse.shell.progress import progress_bar


def _read_all(fd: int) -> str:
    out = b""
    while select.select([fd], [], [], 0.2)[0]:
        out += os.read(fd, 65536)
    return out.decode(errors="replace")


def test_on_a_terminal_the_bar_shows_the_label_and_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = pty.openpty()
    with open(follower, "w", encoding="utf-8") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        with progress_bar("seeding", length=10) as bar:
            bar.update(4, "ledger")
            bar.update(6, "transitions")
        terminal.flush()
        drawn = _read_all(leader)
    os.close(leader)
    assert "seeding" in drawn and "10/10" in drawn and "100%" in drawn


def test_elsewhere_it_prints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    with progress_bar("prune") as bar:
        bar.update(500, "lapse_ledger")
    assert pipe.getvalue() == ""
