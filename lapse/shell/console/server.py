"""Serving the console with uvicorn, in the foreground (`lapse console`) or on a thread of a
process that has its own work (`lapse run`'s console role, the tests)."""

from __future__ import annotations

import ssl
import threading

import uvicorn
from starlette.types import ASGIApp

from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.shell.console.access import Access
from lapse.shell.console.app import create_app
from lapse.shell.signals import stop_on_signals

log = get_logger("console")


def server_config(settings: Settings, app: ASGIApp) -> uvicorn.Config:
    """uvicorn's configuration of the console `app`: console.bind:console.port, HTTPS with
    console.tls_cert/tls_key when set. Its own access log is off: Lapse logs the actions that
    change things, and the refusals."""
    tls = settings.console
    return uvicorn.Config(app, host=tls.bind, port=tls.port, access_log=False, log_config=None, lifespan="on",
                          ssl_certfile=str(tls.tls_cert) if tls.tls_cert else None,
                          ssl_keyfile=str(tls.tls_key) if tls.tls_key else None)


def check_start(settings: Settings) -> None:
    """Refuse (ValueError, one line) what the console must not serve with: a bind beyond this host
    without tokens or without TLS, a certificate and key that do not load."""
    Access(settings.console).check_bind(settings.console.bind)
    cert, key = settings.console.tls_cert, settings.console.tls_key
    if cert is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(str(cert), str(key) if key else None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"console.tls_cert and tls_key do not load: {exc}") from None


def make_server(settings: Settings) -> uvicorn.Server:
    """A uvicorn server of the console (ValueError: see check_start)."""
    check_start(settings)
    return uvicorn.Server(server_config(settings, create_app(settings)))


def serve(settings: Settings, stop: threading.Event | None = None) -> None:
    """Serve until interrupted (SIGINT/SIGTERM, uvicorn's own handling) or until `stop` is set."""
    server = make_server(settings)
    log.info("console served", extra={"bind": settings.console.bind, "port": settings.console.port,
                                      "tls": settings.console.tls_cert is not None})
    # uvicorn raises the signal it stopped on again after its clean shutdown: under the default
    # handler that ends the process by SIGTERM (-15), so a handler that only sets `stopping` takes it.
    stopping = stop if stop is not None else stop_on_signals()

    def exit_when_stopped() -> None:
        stopping.wait()
        server.should_exit = True

    threading.Thread(target=exit_when_stopped, daemon=True, name="console-stop").start()
    server.run()
