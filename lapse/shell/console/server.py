"""Serving the console with uvicorn, in the foreground (`lapse console`) or on a thread of a
process that has its own work (`lapse run`'s console role, the tests)."""

from __future__ import annotations

import threading

import uvicorn

from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.shell.console.app import create_app
from lapse.shell.signals import stop_on_signals

log = get_logger("console")


def make_server(settings: Settings) -> uvicorn.Server:
    """A uvicorn server of the console at console.bind:console.port (ValueError: no tokens and a
    bind beyond this host). Its own access log is off: Lapse logs the actions that change things."""
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.console.bind, port=settings.console.port, access_log=False,
                            log_config=None, lifespan="on")
    return uvicorn.Server(config)


def serve(settings: Settings, stop: threading.Event | None = None) -> None:
    """Serve until interrupted (SIGINT/SIGTERM, uvicorn's own handling) or until `stop` is set."""
    server = make_server(settings)
    log.info("console served", extra={"bind": settings.console.bind, "port": settings.console.port})
    # uvicorn raises the signal it stopped on again after its clean shutdown: under the default
    # handler that ends the process by SIGTERM (-15), so a handler that only sets `stopping` takes it.
    stopping = stop if stop is not None else stop_on_signals()

    def exit_when_stopped() -> None:
        stopping.wait()
        server.should_exit = True

    threading.Thread(target=exit_when_stopped, daemon=True, name="console-stop").start()
    server.run()
