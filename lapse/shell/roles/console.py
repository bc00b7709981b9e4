"""The console role: the operator console in the browser until stopped (`lapse console`, `lapse run
--console`). Beyond loopback it needs tokens and TLS: without, it is a ValueError when built."""

from __future__ import annotations

import threading

from lapse.kernel.settings import Settings
from lapse.shell.roles.base import Role


class ConsoleRole(Role[None]):
    """The console; SIGTERM stops uvicorn cleanly."""

    name = "console"
    uses_kafka = False

    def __init__(self, settings: Settings, *, stop: threading.Event | None = None) -> None:
        super().__init__(settings, stop=stop)
        # function-local: the console's web stack (starlette, uvicorn) is the optional `console` extra
        from lapse.shell.console.server import check_start

        check_start(settings)

    def run(self) -> None:
        # function-local: the console's web stack (starlette, uvicorn) is the optional `console` extra
        from lapse.shell.console.server import serve

        serve(self.settings, self.stop)
