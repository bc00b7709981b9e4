"""What every console page shares (`Console`): who is asking, CSRF-checked forms, rendering a page
or its JSON, and the answer when a dependency is away. The pages are modules of `pages/`;
`app.create_app` assembles them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from lapse.kernel.database import engine_from_settings
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import database_outage, is_transient
from lapse.kernel.settings import Settings
from lapse.shell.console import views
from lapse.shell.console.access import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_MAX_AGE_S,
    Access,
    AccessRefused,
    Identity,
    SignInLimits,
    require_operator,
)
from lapse.shell.console.outages import Outages
from lapse.shell.console.samples import Samples
from lapse.shell.console.times import time_element

HERE = Path(__file__).parent
log = get_logger("console")
API = "/api/v1"
# Every page: never framed by another site, scripts and styles only from the console's own files
# (no inline script), nothing loaded from elsewhere, not cached.
PAGE_HEADERS = {"X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                           "connect-src 'self'; base-uri 'none'; form-action 'self'; "
                                           "frame-ancestors 'none'"}
HSTS = {"Strict-Transport-Security": "max-age=31536000"}


class NotFound(Exception):
    """What a page or API call names does not exist (an operation, an action): 404."""


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return str(value)


def to_json(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, default=_plain, sort_keys=True, indent=indent)


def outage_title(exc: BaseException) -> str:
    """What an outage page is titled: "Database unreachable", "Database read-only", "Kafka unreachable"."""
    if isinstance(exc, (DBAPIError, psycopg.Error, PoolTimeout)):
        return "Database read-only" if database_outage(exc) == "read-only" else "Database unreachable"
    return "Kafka unreachable"


class Console:
    """The application's state: settings, one engine, the access rules, the templates, the
    chart samples and the dependencies found away."""

    def __init__(self, settings: Settings, *, limits: SignInLimits | None = None,
                 sample_every_s: float | None = None) -> None:
        self.settings = settings
        self.access = Access(settings.console, limits)
        self.access.check_bind(settings.console.bind)  # before anything is opened
        self.engine = engine_from_settings(settings)
        self.outages = Outages()
        self.samples = Samples(settings, self.engine, self.outages, every_s=sample_every_s)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.filters["json"] = lambda v: to_json(v, indent=1)
        self.templates.env.filters["q"] = lambda v: quote(str(v), safe="")
        self.headers = {**PAGE_HEADERS, **(HSTS if self.access.tls else {})}

    def client(self, request: Request) -> str:
        return request.client.host if request.client else "unknown"

    def who(self, request: Request) -> Identity | None:
        return self.access.identify(request.cookies.get(SESSION_COOKIE), request.headers.get("authorization"),
                                    self.client(request))

    def who_quietly(self, request: Request) -> Identity | None:
        """`who`, or None where asking is refused (too many failed sign-ins): for an error page."""
        with contextlib.suppress(AccessRefused):
            return self.who(request)
        return None

    def render(self, request: Request, who: Identity | None, name: str, http_status: int = 200,
               **context: Any) -> Response:
        now = views.now_utc()
        return self.templates.TemplateResponse(request, name, {
            "who": who, "csrf": self.access.csrf_token(who), "csrf_field": CSRF_FIELD, "open": self.access.open,
            "page": name.removesuffix(".html"), "when": lambda v: time_element(v, now), **context},
            status_code=http_status, headers=self.headers)

    def json(self, data: Any, http_status: int = 200) -> Response:
        return Response(to_json(data), status_code=http_status, media_type="application/json",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    def refused(self, request: Request, who: Identity | None, exc: AccessRefused) -> Response:
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else {}
        if request.url.path.startswith(API):
            response = self.json({"error": str(exc)}, exc.status)
        else:
            response = self.render(request, who, "error.html", exc.status, message=str(exc), title="Refused")
        response.headers.update(headers)
        return response

    def cookie(self, response: Response, who: Identity) -> None:
        """Set `who`'s session cookie: HttpOnly, SameSite=Strict, and Secure when served over TLS."""
        response.set_cookie(SESSION_COOKIE, who.session or "", max_age=SESSION_MAX_AGE_S, httponly=True,
                            samesite="strict", secure=self.access.tls)

    async def form(self, request: Request, who: Identity | None) -> FormData:
        """The posted form, once its CSRF token has been checked for `who`."""
        form = await request.form()
        token = form.get(CSRF_FIELD)
        self.access.check_csrf(who, token if isinstance(token, str) else None)
        return form

    async def acting(self, request: Request) -> tuple[Identity, FormData]:
        """An operator's posted form: known, CSRF-checked, operator role (else AccessRefused)."""
        who = self.who(request)
        if who is None:
            raise AccessRefused(401, "sign in first")
        form = await self.form(request, who)
        require_operator(who, self.access.open)
        return who, form

    # Pages and their API -----------------------------------------------------------------------

    def page(self, template: str, build: Callable[[Request, Identity], Any]) -> Callable[[Request], Any]:
        """A GET page: signed-in (else to the sign-in page), its data read in a worker thread; a
        build may answer a Response of its own (a redirect)."""
        async def endpoint(request: Request) -> Response:
            try:
                who = self.who(request)
            except AccessRefused as exc:
                return self.refused(request, None, exc)
            if who is None and request.headers.get("authorization"):
                return self.refused(request, None, AccessRefused(401, "no such token"))
            if who is None:
                return RedirectResponse("/login?" + urlencode({"next": request.url.path}), status_code=303)
            try:
                result = await run_in_threadpool(build, request, who)
            except NotFound as exc:
                return self.render(request, who, "error.html", 404, message=str(exc), title="Not found")
            except AccessRefused as exc:
                return self.refused(request, who, exc)
            if isinstance(result, Response):
                return result
            return self.render(request, who, template, **result)
        return endpoint

    def api(self, build: Callable[[Request, Identity], Any]) -> Callable[[Request], Any]:
        """The JSON of a page's data (read-only): 401 without credentials, 404 for what is not there."""
        async def endpoint(request: Request) -> Response:
            try:
                who = self.who(request)
            except AccessRefused as exc:
                return self.refused(request, None, exc)
            if who is None:
                return self.json({"error": "sign in, or send Authorization: Bearer <token>"}, 401)
            try:
                result = await run_in_threadpool(build, request, who)
            except NotFound as exc:
                return self.json({"error": str(exc)}, 404)
            except AccessRefused as exc:
                return self.refused(request, who, exc)
            if isinstance(result, Response):
                return result
            return self.json(result)
        return endpoint

    async def failed(self, request: Request, exc: Exception) -> Response:
        """Whatever a page meets: one line on the error page, never a traceback. An outage (the
        database away or read-only while it fails over, the broker away) is a 503 with one log
        line when it begins (`Outages`): reading pages go on serving from a read-only database, an
        operator action waits for it; anything else (a bug) is a 500 with the traceback in the log."""
        line = views.error_line(exc, self.settings)
        who = self.who_quietly(request)
        if is_transient(exc):
            title = outage_title(exc)
            self.outages.down(title.split()[0].lower(), line)
            if request.url.path.startswith(API):
                return self.json({"error": f"{title}: {line}"}, 503)
            return self.render(request, who, "error.html", 503, message=f"{line}; try again in a moment",
                               title=title)
        log.error("console page failed", exc_info=exc, extra={"path": request.url.path})
        if request.url.path.startswith(API):
            return self.json({"error": line}, 500)
        return self.render(request, who, "error.html", 500, message=line, title="Not done")


__all__ = ["API", "HERE", "Console", "NotFound", "to_json"]
