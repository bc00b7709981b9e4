"""Signing in and out: a token gives a session (on the open console, a name does); signing out
ends the session in this process, so a copied cookie stops working. Failed attempts are limited
per client and overall (429 with Retry-After)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from lapse.kernel.logs import get_logger
from lapse.shell.console.access import SESSION_COOKIE, AccessRefused

if TYPE_CHECKING:
    from lapse.shell.console.core import Console

log = get_logger("console")


def _target(value: object) -> str:
    """Where to go after signing in: a path of this console only."""
    target = str(value or "/")
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"


def routes(console: Console) -> list[BaseRoute]:
    async def login_page(request: Request) -> Response:
        return console.render(request, None, "login.html", next=_target(request.query_params.get("next")))

    async def login(request: Request) -> Response:
        client = console.client(request)
        try:
            form = await console.form(request, None)
            token, name = form.get("token"), form.get("name")
            who = console.access.sign_in(client, token=token if isinstance(token, str) else "",
                                         name=name if isinstance(name, str) else "")
        except AccessRefused as exc:
            return console.refused(request, None, exc)
        if who is None:
            log.info("console sign-in refused", extra={"client": client})
            message = "give a name: letters, digits and . _ @ -" if console.access.open else "no such token"
            return console.render(request, None, "login.html", 401, next=_target(form.get("next")), message=message)
        response = RedirectResponse(_target(form.get("next")), status_code=303)
        console.cookie(response, who)
        return response

    async def logout(request: Request) -> Response:
        try:
            who = console.who(request)
            await console.form(request, who)
        except AccessRefused as exc:
            return console.refused(request, None, exc)
        if who is not None and who.session:
            console.access.sessions.end(who.session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict", secure=console.access.tls)
        return response

    return [Route("/login", login_page, methods=["GET"]), Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"])]
