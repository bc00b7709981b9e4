"""A stop signal arriving while the main thread waits on the very event it sets: CPython runs the
handler on the main thread, possibly right after `Event.wait` took back the event's lock, so a
handler that sets the event there itself waits for that lock forever (`lapse run` hung on SIGTERM)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from lapse.shell.signals import stop_on_signals


@pytest.fixture
def handlers_restored() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("handlers_restored")
def test_a_signal_handled_while_the_event_lock_is_held_sets_the_event_once_released() -> None:
    stop, hurry = threading.Event(), threading.Event()
    stop_on_signals(stop, hurry=hurry)
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)

    def in_wait() -> None:  # where Event.wait holds the event's lock when the handler runs
        with stop._cond:  # type: ignore[attr-defined]
            handler(signal.SIGTERM, None)

    waiter = threading.Thread(target=in_wait, daemon=True)
    waiter.start()
    waiter.join(timeout=5)
    assert not waiter.is_alive(), "the handler waited for a lock its own thread holds"
    assert stop.wait(timeout=5) and not hurry.is_set()
    handler(signal.SIGTERM, None)  # a second signal: hurry
    assert hurry.wait(timeout=5)
