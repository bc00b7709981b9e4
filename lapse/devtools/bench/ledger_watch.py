"""Reading a stage's outcome from the ledger: wait for n terminal rows, and the rate they took.

A rate runs from the first ledger row's creation (stamped by the processor when its first batch
starts) to the moment a watcher saw the n-th row terminal, so process start-up and group joins
are reported apart from it, and the last batch's commit is inside it (the ledger stamps
finished_at at batch start, so its own timestamps would leave the last batch out).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select

from lapse.devtools.brokers import terminate_process
from lapse.devtools.demo_tables import reservations
from lapse.kernel.ledger import TERMINAL
from lapse.kernel.models import cleanup_ledger as L


class StageFailed(RuntimeError):
    """A stage did not finish its work (a process died, or nothing moved for too long)."""


def terminal_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).where(L.c.state.in_(TERMINAL))).scalar_one()


def wait_terminal(engine: Engine, n: int, *, alive: Callable[[], bool] = lambda: True,
                  stall_s: float = 60.0, poll_s: float = 0.02) -> float:
    """Block until the ledger holds `n` terminal rows; returns the wall-clock time it saw them.

    Raises StageFailed if `alive()` turns false first or the count stops moving for `stall_s`."""
    last, moved = -1, time.monotonic()
    while True:
        done = terminal_count(engine)
        now = time.monotonic()
        if done >= n:
            return time.time()
        if done != last:
            last, moved = done, now
        if not alive():
            raise StageFailed(f"the stage's process exited with {done} of {n} rows terminal")
        if now - moved > stall_s:
            raise StageFailed(f"no progress for {stall_s:.0f}s at {done} of {n} terminal rows")
        time.sleep(poll_s)


@dataclass
class Span:
    """n rows made terminal in `seconds` (first row created → n-th row seen terminal)."""

    rows: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def ledger_span(engine: Engine, n: int, seen_at: float) -> Span:
    """From the first ledger row's creation to `seen_at` (epoch seconds, from wait_terminal)."""
    with engine.connect() as conn:
        first = conn.execute(select(func.min(L.c.created_at))).scalar_one()
    return Span(n, seen_at - first.timestamp())


def released_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).where(reservations.c.status == "released")).scalar_one()


def run_watched(cmd: list[str], args: dict[str, Any], engine: Engine, events: int, cwd: str, who: str
                ) -> dict[str, Any]:
    """Start `cmd` in `cwd` with `args` as JSON on stdin (they may hold secrets, which a command
    line would show to every local user), wait until the ledger holds `events` terminal rows, and
    stop it; the rate (`ledger_span`) and its start-up time. A process that exits or stalls first
    fails the stage with the last lines it wrote."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    assert proc.stdin is not None
    with proc.stdin:
        proc.stdin.write(json.dumps(args).encode())
    started = time.time()
    try:
        try:
            seen_at = wait_terminal(engine, events, alive=lambda: proc.poll() is None, stall_s=90)
        except StageFailed as exc:
            proc.kill()
            err = proc.stderr.read() if proc.stderr is not None else b""
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise StageFailed(f"{who}: {exc}: {' | '.join(tail)}") from None
        span = ledger_span(engine, events, seen_at)
    finally:
        terminate_process(proc, 15.0)
        if proc.stderr is not None:
            proc.stderr.close()
    return {"events": events, "seconds": round(span.seconds, 3), "events_per_s": round(span.rate, 1),
            "startup_s": round(seen_at - started - span.seconds, 3)}
