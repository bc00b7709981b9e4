"""Dependencies the console found away: one warning line when one goes, one info line when it is
back, however many requests and samples meet it in between (no tracebacks)."""

from __future__ import annotations

from lapse.kernel.logs import get_logger

log = get_logger("console")


class Outages:
    """What is away now ({what: its one line}), and the lines that say so."""

    def __init__(self) -> None:
        self.away: dict[str, str] = {}

    def down(self, what: str, line: str) -> None:
        if what not in self.away:
            log.warning(f"console: the {what} is unavailable; what needs it answers 503 until it is back",
                        extra={"error": line})
        self.away[what] = line

    def up(self, what: str) -> None:
        if self.away.pop(what, None) is not None:
            log.info(f"console: the {what} is reachable again")


__all__ = ["Outages"]
