"""librdkafka's own log lines, through Python logging and rate-limited.

Left alone, librdkafka writes its lines straight to stderr from its own threads: a broker that
cannot be reached prints one per reconnect attempt, hundreds a minute, around whatever Lapse says.
Every client the factories make gets a `KafkaLogSink` as its `logger` (confluent-kafka hands it
each line when the client is polled, flushed or closed), which passes the line to the `lapse.kafka`
logger — to `lapse.kafka.connection` when it says a broker could not be reached — the same line at
most once per REPEAT_WINDOW_S per client, with the count of those held back. Only warnings and
above pass, unless the runtime log level is DEBUG.

A one-shot command reports an unreachable broker itself, in its one error line; it calls
`leave_connection_failures_to_caller()` so librdkafka's connect failures drop to DEBUG while it
runs (the lines are served on the thread that polls the client, the command's own).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from lapse.kernel.settings import Settings

LOGGER = "lapse.kafka"
CONNECTION_LOGGER = "lapse.kafka.connection"
REPEAT_WINDOW_S = 30.0
# Distinct lines remembered per client; older ones are forgotten first (a bound, not a policy).
MAX_REMEMBERED = 256
# librdkafka facilities of a failure to reach or keep a broker connection.
CONNECTION_FACILITIES = frozenset({"FAIL", "CONNECT", "BROKERFAIL", "REQTMOUT", "TIMEOUT"})
# Parts of a line that change between repeats of the same event (a connect attempt's duration,
# librdkafka's own suppression count): not part of what makes two lines "the same".
_DURATION = re.compile(r"\b\d+(?:\.\d+)?\s*(?:ms|s)\b")
_SUPPRESSED = re.compile(r",?\s*\d+ identical error\(s\) suppressed")


# Whether the command running in this context reports an unreachable broker itself. A context
# variable, so it ends with the command (the shell runs each in a copy of the context).
_CONNECTION_FAILURES_TO_CALLER: ContextVar[bool] = ContextVar("lapse_connection_failures_to_caller",
                                                              default=False)


def leave_connection_failures_to_caller() -> None:
    """For the rest of this command (a one-shot one), librdkafka's failures to reach a broker log
    at DEBUG: the command says so itself, once, if it cannot do its work."""
    _CONNECTION_FAILURES_TO_CALLER.set(True)


def _shape(text: str) -> str:
    return _DURATION.sub("#", _SUPPRESSED.sub("", text))


class KafkaLogSink:
    """What a client gets as its `logger`: confluent-kafka calls `log(level, "%s [%s] %s",
    facility, client name, text)` with the level already mapped to Python's."""

    def __init__(self, threshold: int = logging.WARNING, window_s: float = REPEAT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._shown: dict[tuple[str, str], tuple[float, int]] = {}  # (facility, shape) → (shown at, held back)

    @classmethod
    def for_settings(cls, settings: Settings) -> KafkaLogSink:
        """Warnings and above, everything when the runtime log level is DEBUG."""
        debug = settings.runtime.log_level.upper() == "DEBUG"
        return cls(threshold=logging.DEBUG if debug else logging.WARNING)

    def log(self, level: int, fmt: str, *args: Any, **_kwargs: Any) -> None:
        facility, client, text = (str(a) for a in args) if len(args) == 3 else ("", "", fmt % args)
        connection = facility in CONNECTION_FACILITIES or "brokers are down" in text
        if connection and _CONNECTION_FAILURES_TO_CALLER.get():
            level = logging.DEBUG
        logger = logging.getLogger(CONNECTION_LOGGER if connection else LOGGER)
        if level < self.threshold or not logger.isEnabledFor(level):
            return
        held_back = self._admit((facility, _shape(text)))
        if held_back is None:
            return
        note = f" ({held_back} more like it in the last {self.window_s:.0f}s)" if held_back else ""
        logger.log(level, "%s%s", text, note, extra={"client": client, "facility": facility})

    def _admit(self, key: tuple[str, str]) -> int | None:
        """None when `key` was shown within the window (counted as held back); else how many were
        held back since it was last shown."""
        now = self._clock()
        with self._lock:
            shown_at, held_back = self._shown.get(key, (None, 0))
            if shown_at is not None and now - shown_at < self.window_s:
                self._shown[key] = (shown_at, held_back + 1)
                return None
            self._shown.pop(key, None)
            self._shown[key] = (now, 0)
            while len(self._shown) > MAX_REMEMBERED:
                del self._shown[next(iter(self._shown))]
            return held_back


__all__ = ["CONNECTION_LOGGER", "LOGGER", "REPEAT_WINDOW_S", "KafkaLogSink", "leave_connection_failures_to_caller"]
