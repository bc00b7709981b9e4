"""One way to stop a long-running role: SIGTERM and SIGINT set a `threading.Event` that the role's
loop checks between steps, so it finishes the current step (a batch, a pass) and returns."""

from __future__ import annotations

import signal
import threading


def stop_on_signals(stop: threading.Event | None = None) -> threading.Event:
    """Make SIGTERM and SIGINT set `stop` (a new event when None) and return it."""
    stop = stop or threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
