"""Finding operations: one operation's whole history (404 when the ledger has no such row), search
by op key, correlation id or business id (kind and subject id), a tenant's operations a page at a
time, and an operator action with the progress of what it released. Each is also JSON under
`/api/v1/`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Route

from lapse.readers import operation_of_subject, tenant_operations
from lapse.shell.console import views
from lapse.shell.console.access import AccessRefused, Identity
from lapse.shell.console.core import NotFound

if TYPE_CHECKING:
    from lapse.shell.console.core import Console

TENANT_PAGE = 50
FIELD_MAX = 200  # the longest kind, subject id, tenant or query the search takes (the ledger's op key width)


def _field(request: Request, name: str) -> str:
    value = request.query_params.get(name, "").strip()
    if len(value) > FIELD_MAX or any(ord(c) < 32 for c in value):
        raise AccessRefused(400, f"{name}: at most {FIELD_MAX} printable characters")
    return value


def routes(console: Console) -> list[BaseRoute]:
    def operation(request: Request, who: Identity) -> dict[str, Any]:
        op_key = request.path_params["op_key"]
        found = views.history(console.engine, console.settings, op_key)
        if found is None:
            raise NotFound(f"no operation {op_key} in the ledger")
        return {"op_key": op_key, "h": found}

    def search(request: Request, who: Identity) -> dict[str, Any]:
        """`q`: an op key or a correlation id; `kind` and `subject`: a business id; `tenant` (with
        `kind` where given, from `after`): a tenant's operations."""
        query, kind, subject, tenant = (_field(request, n) for n in ("q", "kind", "subject", "tenant"))
        after = _field(request, "after") or None
        out: dict[str, Any] = {"query": query, "kind": kind, "subject": subject, "tenant": tenant,
                               "found": None, "tenant_page": None}
        if kind and subject:
            with console.engine.connect() as conn:
                op_key = operation_of_subject(conn, kind, subject)
            out["found"] = {"query": f"{kind} {subject}", "operations": [{"op_key": op_key}] if op_key else [],
                            "more": False}
        elif tenant:
            with console.engine.connect() as conn:
                out["tenant_page"] = tenant_operations(conn, tenant, kind or None, after, TENANT_PAGE)
        elif query:
            out["found"] = views.search(console.engine, console.settings, query, views.now_utc())
        return out

    def search_page(request: Request, who: Identity) -> Any:
        out = search(request, who)
        found = out["found"]
        if found and len(found["operations"]) == 1 and "ledger" not in found["operations"][0]:
            return RedirectResponse(f"/operations/{quote(found['operations'][0]['op_key'], safe='')}",
                                    status_code=303)
        return out

    def action(request: Request, who: Identity) -> dict[str, Any]:
        action_id = request.path_params["action_id"]
        progress = views.action_progress(console.engine, action_id)
        if progress is None:
            raise NotFound(f"no operator action {action_id}")
        return {"progress": progress, "action_id": action_id}

    return [Route("/operations/{op_key:path}", console.page("operation.html", operation)),
            Route("/api/v1/operations/{op_key:path}", console.api(operation)),
            Route("/search", console.page("search.html", search_page)),
            Route("/api/v1/search", console.api(search)),
            Route("/actions/{action_id:int}", console.page("action.html", action)),
            Route("/api/v1/actions/{action_id:int}", console.api(action))]
