"""Brakes: what is paused (since when, by whom, why, how much work waits), the held work of
undeclared kinds, what each shadow-mode kind recorded and the call limits every worker shares (each
route's rate now, a Retry-After's stop, slots held; each endpoint's last minute); an operator pauses
a kind (or one tenant of it) and resumes it, each recorded as an operator action
(docs/design/brakes.md, docs/design/limits.md). `/api/v1/brakes` is the same data as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from lapse import operator_actions
from lapse.kernel.brakes import shadow_results
from lapse.kernel.clock import engine_now
from lapse.kernel.kinds import KindsFileError, declared_names, load_kinds
from lapse.readers import brakes_status, limits_status
from lapse.shell.console.access import AccessRefused, Identity

if TYPE_CHECKING:
    from lapse.shell.console.core import Console

SHADOW_LATEST = 5  # shadow records shown per kind


def declared(console: Console) -> list[str]:
    """The kinds the kinds file declares (what a pause may name); none without a readable file."""
    try:
        return sorted(declared_names(console.settings.kinds.file)) if console.settings.kinds.file else []
    except KindsFileError:
        return []


def brakes_data(console: Console) -> dict[str, Any]:
    kinds = declared(console)
    with console.engine.connect() as conn:
        found = brakes_status(conn, engine_now(console.engine), frozenset(kinds) if kinds else None)
        shadows = [shadow_results(conn, kind, latest=SHADOW_LATEST).to_dict() for kind in found["shadowed"]]
        limits = limits_status(conn)
    return {**found, "kinds": kinds, "shadows": shadows, "limits": limits}


def routes(console: Console) -> list[BaseRoute]:
    def page(request: Request, who: Identity) -> dict[str, Any]:
        return brakes_data(console)

    def api(request: Request, who: Identity) -> dict[str, Any]:
        return brakes_data(console)

    async def change(request: Request, resume: bool) -> Response:
        try:
            who, form = await console.acting(request)
        except AccessRefused as exc:
            return console.refused(request, console.who_quietly(request), exc)
        kind = str(form.get("kind") or "").strip()
        tenant = str(form.get("tenant") or "").strip() or None
        reason = str(form.get("reason") or "").strip()
        verb = "resume" if resume else "pause"
        problem = (f"a {verb} needs a reason (kept in the audit trail)" if not reason
                   else f"no kind {kind!r} in the kinds file" if not resume and kind not in declared(console)
                   else "a tenant is 1 to 64 characters" if tenant is not None and len(tenant) > 64 else None)
        if problem:
            return console.render(request, who, "error.html", 400, title="Not done", message=problem)
        if resume:
            done = await run_in_threadpool(lambda: operator_actions.run_resume(
                console.engine, load_kinds(console.settings, console.engine), console.settings.topology, kind,
                tenant, reason=reason, actor=who.name, via="console"))
            if not done["resumed"]:
                return console.render(request, who, "error.html", 409, title="Not done",
                                      message=f"{kind}{'/' + tenant if tenant else ''} is not paused")
        else:
            await run_in_threadpool(lambda: operator_actions.run_pause(
                console.engine, kind, tenant, reason=reason, actor=who.name, via="console"))
        return RedirectResponse("/brakes", status_code=303)

    async def pause(request: Request) -> Response:
        return await change(request, resume=False)

    async def resume(request: Request) -> Response:
        return await change(request, resume=True)

    return [Route("/brakes", console.page("brakes.html", page)),
            Route("/api/v1/brakes", console.api(api)),
            Route("/brakes/pause", pause, methods=["POST"]),
            Route("/brakes/resume", resume, methods=["POST"])]
