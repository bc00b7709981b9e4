"""One way to stop a long-running role: SIGTERM and SIGINT set a `threading.Event` that the role's
loop checks between steps, so it finishes the current step (a batch, a pass, a page) and returns.
A later signal sets `hurry` when one is given: the caller's cue to shorten what it still waits for
(the supervisor's shutdown grace)."""

from __future__ import annotations

import signal
import threading


def stop_on_signals(stop: threading.Event | None = None, *,
                    hurry: threading.Event | None = None) -> threading.Event:
    """Make the first SIGTERM or SIGINT set `stop` (a new event when None), and every later one
    set `hurry` (when given); return `stop`."""
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        if stop.is_set() and hurry is not None:
            hurry.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return stop
