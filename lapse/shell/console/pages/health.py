"""Probes: `/healthz` answers while the process serves (liveness), `/readyz` while the database
answers too (readiness). Neither needs a sign-in nor tells more than ok or why not."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import text
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from lapse.kernel.outages import is_transient
from lapse.shell.console import views

if TYPE_CHECKING:
    from lapse.shell.console.core import Console


def routes(console: Console) -> list[BaseRoute]:
    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n", headers={"Cache-Control": "no-store"})

    def database_answers() -> str | None:
        try:
            with console.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:
            if not is_transient(exc):
                raise
            line = views.error_line(exc, console.settings)
            console.outages.down("database", line)
            return line
        console.outages.up("database")
        return None

    async def readyz(request: Request) -> Response:
        problem = await run_in_threadpool(database_answers)
        if problem is None:
            return PlainTextResponse("ready\n", headers={"Cache-Control": "no-store"})
        return PlainTextResponse(f"database unreachable: {problem}\n", status_code=503,
                                 headers={"Cache-Control": "no-store"})

    return [Route("/healthz", healthz), Route("/readyz", readyz)]
