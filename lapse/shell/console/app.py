"""The console's web application: Starlette routes, one module per page in `pages/`, each giving a
page (a Jinja2 template, server-rendered) and the same data as JSON under `/api/v1/`.
`RequestGuard` checks `Host` and `Origin` before any route runs; `CatchFailures` answers what
escapes a route with one line."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lapse.kernel.settings import Settings
from lapse.shell.console.access import SignInLimits
from lapse.shell.console.core import HERE, Console
from lapse.shell.console.guard import RequestGuard
from lapse.shell.console.pages import PAGES


class CatchFailures:
    """ASGI middleware answering what escapes a route with `Console.failed` (Starlette's own
    handler for `Exception` re-raises it to the server, which logs a traceback per request)."""

    def __init__(self, app: ASGIApp, console: Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            response = await self.console.failed(Request(scope), exc)
            await response(scope, receive, send)


def create_app(settings: Settings, *, limits: SignInLimits | None = None,
               sample_every_s: float | None = None) -> Starlette:
    """The console for `settings`; refuses (ValueError) a non-loopback bind with no tokens or no TLS.
    `limits` and `sample_every_s` replace the sign-in limits and the chart sampling period (0: sample
    only when an overview is rendered)."""
    console = Console(settings, limits=limits, sample_every_s=sample_every_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.samples.start()
        try:
            yield
        finally:
            console.samples.stop()
            console.engine.dispose()

    routes: list[BaseRoute] = [route for page in PAGES for route in page.routes(console)]
    routes.append(Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"))
    return Starlette(routes=routes, lifespan=lifespan, middleware=[
        Middleware(RequestGuard, settings=settings.console), Middleware(CatchFailures, console=console)])


__all__ = ["create_app"]
