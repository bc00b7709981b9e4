"""The console's web application: Starlette routes that check who is asking (and, on a form, its
CSRF token), read their page's data through `views` and render a Jinja2 template. Pages are
server-rendered; the overview refreshes itself by plain polling (a meta refresh), no JavaScript."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from lapse import operator_actions
from lapse.kernel.database import engine_from_settings
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import OUTAGE_ERRORS, is_transient
from lapse.kernel.settings import Settings
from lapse.shell.console import views
from lapse.shell.console.access import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_MAX_AGE_S,
    Access,
    AccessRefused,
    Identity,
    require_operator,
)

HERE = Path(__file__).parent
log = get_logger("console")
OVERVIEW_REFRESH_S = 15
# Every page: never framed by another site, no script and nothing loaded from elsewhere, not cached.
PAGE_HEADERS = {"X-Frame-Options": "DENY", "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
                "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True, indent=1)


class Console:
    """The application's state: settings, one engine, the access rules and the templates."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.access = Access(settings.console)
        self.access.check_bind(settings.console.bind)  # before anything is opened
        self.engine = engine_from_settings(settings)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.filters["json"] = _json
        self.templates.env.filters["q"] = lambda v: quote(str(v), safe="")

    def who(self, request: Request) -> Identity | None:
        return self.access.identify(request.cookies.get(SESSION_COOKIE), request.headers.get("authorization"))

    def render(self, request: Request, who: Identity | None, name: str, http_status: int = 200,
               **context: Any) -> Response:
        return self.templates.TemplateResponse(request, name, {
            "who": who, "csrf": self.access.csrf_token(who), "csrf_field": CSRF_FIELD,
            "open": self.access.open, "page": name.removesuffix(".html"), **context}, status_code=http_status,
            headers=PAGE_HEADERS)

    def refused(self, request: Request, who: Identity | None, exc: AccessRefused) -> Response:
        return self.render(request, who, "error.html", exc.status, message=str(exc))

    async def form(self, request: Request, who: Identity | None) -> FormData:
        """The posted form, once its CSRF token has been checked for `who`."""
        form = await request.form()
        token = form.get(CSRF_FIELD)
        self.access.check_csrf(who, token if isinstance(token, str) else None)
        return form

    # Pages -------------------------------------------------------------------------------------

    def page(self, build: Callable[[Request, Identity], Any]) -> Callable[[Request], Any]:
        """A GET page: signed-in (else to the sign-in page), its data read in a worker thread."""
        async def endpoint(request: Request) -> Response:
            who = self.who(request)
            if who is None:
                return RedirectResponse("/login?" + urlencode({"next": request.url.path}), status_code=303)
            result = await run_in_threadpool(build, request, who)
            if isinstance(result, Response):
                return result
            name, context = result
            return self.render(request, who, name, **context)
        return endpoint

    def overview(self, request: Request, who: Identity) -> Any:
        return "overview.html", {**views.overview(self.settings, self.engine, views.now_utc()),
                                 "refresh_s": OVERVIEW_REFRESH_S}

    def dead_letters(self, request: Request, who: Identity) -> Any:
        flt = views.DeadLetterFilter.parse(dict(request.query_params))
        return "dead_letters.html", {"filter": flt, **views.dead_letter_list(self.settings, self.engine, flt)}

    def operation(self, request: Request, who: Identity) -> Any:
        op_key = request.path_params["op_key"]
        found = views.history(self.engine, self.settings, op_key)
        return "operation.html", {"op_key": op_key, "h": found}

    def search(self, request: Request, who: Identity) -> Any:
        query = request.query_params.get("q", "").strip()
        found = views.search(self.engine, self.settings, query, views.now_utc()) if query else None
        if found and len(found["operations"]) == 1 and found["operations"][0]["op_key"] == query:
            return RedirectResponse(f"/operations/{quote(query, safe='')}", status_code=303)
        return "search.html", {"query": query, "found": found}

    def action(self, request: Request, who: Identity) -> Any:
        progress = views.action_progress(self.engine, request.path_params["action_id"])
        return "action.html", {"progress": progress, "action_id": request.path_params["action_id"]}

    def activity(self, request: Request, who: Identity) -> Any:
        return "activity.html", views.activity(self.engine)

    # Forms -------------------------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        return self.render(request, None, "login.html", next=request.query_params.get("next", "/"))

    async def login(self, request: Request) -> Response:
        try:
            form = await self.form(request, None)
        except AccessRefused as exc:
            return self.refused(request, None, exc)
        token = form.get("token")
        who = self.access.by_token(token) if isinstance(token, str) and token else None
        if who is None:
            return self.render(request, None, "login.html", 401, next=form.get("next") or "/",
                               message="no such token")
        target = str(form.get("next") or "/")
        response = RedirectResponse(target if target.startswith("/") and not target.startswith("//") else "/",
                                    status_code=303)
        response.set_cookie(SESSION_COOKIE, self.access.session_cookie(who), max_age=SESSION_MAX_AGE_S,
                            httponly=True, samesite="strict")
        return response

    async def logout(self, request: Request) -> Response:
        who = self.who(request)
        try:
            await self.form(request, who)
        except AccessRefused as exc:
            return self.refused(request, who, exc)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    async def acting(self, request: Request) -> tuple[Identity, FormData]:
        """An operator's posted form: known, CSRF-checked, operator role (else AccessRefused)."""
        who = self.who(request)
        if who is None:
            raise AccessRefused(401, "sign in first")
        form = await self.form(request, who)
        require_operator(who)
        return who, form

    async def replay_preview(self, request: Request) -> Response:
        """The dry run of a replay of the ticked dead letters, with the confirmation form."""
        try:
            who, form = await self.acting(request)
        except AccessRefused as exc:
            return self.refused(request, self.who(request), exc)
        selection = views.replay_selection([str(k) for k in form.getlist("op_key")],
                                           form.get("include_replayed") == "1")
        if not selection.op_keys:
            return self.render(request, who, "error.html", 400, message="tick the dead letters to replay first")
        preview = await run_in_threadpool(operator_actions.preview, self.engine, selection, views.REPLAY_LIMIT)
        count = preview["matching"]
        return self.render(request, who, "action_preview.html", preview=preview,
                           include_replayed=selection.include_replayed, action={
                               "title": "Replay", "noun": "replay", "verb": "release", "count": count,
                               "button": f"Release {count} dead letter(s)", "none": "is waiting for a replay"})

    async def replay_confirm(self, request: Request) -> Response:
        """The confirmed replay: released under one replay id, recorded with the token's name as
        the actor; then its progress page."""
        try:
            who, form = await self.acting(request)
        except AccessRefused as exc:
            return self.refused(request, self.who(request), exc)
        reason = str(form.get("reason") or "").strip()
        selection = views.replay_selection([str(k) for k in form.getlist("op_key")],
                                           form.get("include_replayed") == "1")
        if not reason or not selection.op_keys:
            return self.render(request, who, "error.html", 400,
                               message="a replay needs the dead letters and a reason (kept in the audit trail)")
        shown = int(str(form.get("shown") or 0)) if str(form.get("shown") or "0").isdigit() else 0
        done = await run_in_threadpool(lambda: operator_actions.run_replay(
            self.engine, selection, limit=views.REPLAY_LIMIT, actor=who.name, reason=reason, shown=shown,
            expiry_topic=self.settings.topology.expiry, via="console"))
        if done["action_id"] is None:
            return self.render(request, who, "error.html", 409,
                               message="nothing replayed: none of those dead letters is waiting any more")
        return RedirectResponse(f"/actions/{done['action_id']}", status_code=303)

    async def discard_preview(self, request: Request) -> Response:
        """The dry run of a discard of the ticked dead letters, with the confirmation form."""
        try:
            who, form = await self.acting(request)
        except AccessRefused as exc:
            return self.refused(request, self.who(request), exc)
        selection = operator_actions.discard_selection(op_keys=tuple(str(k) for k in form.getlist("op_key")))
        if not selection.op_keys:
            return self.render(request, who, "error.html", 400, message="tick the dead letters to discard first")
        preview = await run_in_threadpool(operator_actions.preview, self.engine, selection, views.REPLAY_LIMIT)
        count = preview["matching"]
        return self.render(request, who, "action_preview.html", preview=preview, action={
            "title": "Discard", "noun": "discard", "verb": "discard", "count": count,
            "warning": "A discarded dead letter is never retried or replayed.",
            "button": f"Discard {count} dead letter(s) for good", "none": "is still a dead letter"})

    async def discard_confirm(self, request: Request) -> Response:
        """The confirmed discard: the dead letters move to `discarded`, recorded with the token's
        name as the actor; then the action's page."""
        try:
            who, form = await self.acting(request)
        except AccessRefused as exc:
            return self.refused(request, self.who(request), exc)
        reason = str(form.get("reason") or "").strip()
        selection = operator_actions.discard_selection(op_keys=tuple(str(k) for k in form.getlist("op_key")))
        if not reason or not selection.op_keys:
            return self.render(request, who, "error.html", 400,
                               message="a discard needs the dead letters and a reason (kept in the audit trail)")
        shown = str(form.get("shown") or "0")
        done = await run_in_threadpool(lambda: operator_actions.run_discard(
            self.engine, selection, limit=views.REPLAY_LIMIT, actor=who.name, reason=reason,
            shown=int(shown) if shown.isdigit() else 0, via="console"))
        if done["action_id"] is None:
            return self.render(request, who, "error.html", 409,
                               message="nothing discarded: none of those dead letters is waiting any more")
        return RedirectResponse(f"/actions/{done['action_id']}", status_code=303)

    # Application -------------------------------------------------------------------------------

    def routes(self) -> list[Route | Mount]:
        return [
            Route("/", self.page(self.overview)),
            Route("/dead-letters", self.page(self.dead_letters)),
            Route("/dead-letters/replay", self.replay_preview, methods=["POST"]),
            Route("/dead-letters/replay/confirm", self.replay_confirm, methods=["POST"]),
            Route("/dead-letters/discard", self.discard_preview, methods=["POST"]),
            Route("/dead-letters/discard/confirm", self.discard_confirm, methods=["POST"]),
            Route("/operations/{op_key:path}", self.page(self.operation)),
            Route("/search", self.page(self.search)),
            Route("/actions/{action_id:int}", self.page(self.action)),
            Route("/activity", self.page(self.activity)),
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ]


def create_app(settings: Settings) -> Starlette:
    """The console for `settings`; refuses (ValueError) a non-loopback bind with no tokens."""
    console = Console(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            console.engine.dispose()

    async def failed(request: Request, exc: Exception) -> Response:
        """Whatever a page meets: one line on the error page, never a traceback. An outage (the
        database away or read-only while it fails over, the broker away) is a 503 and a warning:
        reading pages go on serving from a read-only database, an operator action waits for it;
        anything else (a bug) is a 500 with the traceback in the log."""
        line = views.error_line(exc, settings)
        if is_transient(exc):
            log.warning("console page unavailable: a dependency is away", extra={"path": request.url.path,
                                                                                 "error": line})
            return console.render(request, console.who(request), "error.html", 503,
                                  message=f"{line}; try again in a moment")
        log.error("console page failed", exc_info=exc, extra={"path": request.url.path})
        return console.render(request, console.who(request), "error.html", 500, message=line)

    # Keyed by the outages' classes too: Starlette answers with those and is done, while the
    # `Exception` handler answers and then raises again (uvicorn logs a traceback, drops the connection).
    return Starlette(routes=console.routes(), lifespan=lifespan,
                     exception_handlers={**dict.fromkeys(OUTAGE_ERRORS, failed), Exception: failed})


__all__ = ["Console", "create_app"]
