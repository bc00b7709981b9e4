"""Reports and actions: the stored daily reports and the recent operator actions
(`/api/v1/activity` as JSON)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from lapse.shell.console import views
from lapse.shell.console.access import Identity

if TYPE_CHECKING:
    from lapse.shell.console.core import Console


def routes(console: Console) -> list[BaseRoute]:
    def activity(request: Request, who: Identity) -> dict[str, Any]:
        return views.activity(console.engine)

    return [Route("/activity", console.page("activity.html", activity)),
            Route("/api/v1/activity", console.api(activity))]
