"""One way to stop a long-running role: SIGTERM and SIGINT set a `threading.Event` that the role's
loop checks between steps, so it finishes the current step (a batch, a pass, a page) and returns.
A later signal sets `hurry` when one is given: the caller's cue to shorten what it still waits for
(the supervisor's shutdown grace).

The handler runs on the main thread, possibly while that thread holds the lock of the very event
it would set (right after `Event.wait` took it back): setting it there waits forever. So the
handler counts the signal and leaves the setting to a thread of its own."""

from __future__ import annotations

import signal
import threading


def stop_on_signals(stop: threading.Event | None = None, *,
                    hurry: threading.Event | None = None) -> threading.Event:
    """Make the first SIGTERM or SIGINT set `stop` (a new event when None), and every later one
    set `hurry` (when given); return `stop`."""
    stop = stop or threading.Event()
    received = [0]

    def on_signal(signum: int, frame: object) -> None:
        received[0] += 1
        later = received[0] > 1 or stop.is_set()
        events = [stop, hurry] if later and hurry is not None else [stop]
        def set_them() -> None:
            for event in events:
                event.set()

        threading.Thread(target=set_them, name="lapse-signal", daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return stop
