"""The console's defence against DNS rebinding and cross-site posts, before any route runs.

A rebinding page is served from a name the attacker controls that, resolved again, points at the
console: the browser then sends that name as `Host` and treats the console as the attacker's own
origin. So every request must name the console: `Host` must be `localhost`, one of
`console.allowed_hosts`, the bind address, or an IP literal the console can be reached by (a page
cannot make a browser send an IP literal for its own origin) — else 421. A state-changing request
(anything but GET, HEAD, OPTIONS) must also carry an `Origin` naming the host and port the request
was sent to — else 403; only a bearer token, which no browser sends by itself,
stands in for it. Each refusal is one warning line."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from lapse.kernel.logs import get_logger
from lapse.kernel.settings import ConsoleSettings
from lapse.shell.console.access import is_loopback

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
log = get_logger("console")


def split_host(value: str) -> tuple[str, int | None] | None:
    """(host, port) of a `Host` header value, the host lower-cased without brackets or a final dot
    (None: not a host)."""
    try:
        parts = urlsplit("//" + value.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.path or parts.query or parts.username is not None:
        return None
    return host.rstrip("."), port


class HostPolicy:
    """Which `Host` names the console answers to, from its settings (see the module docstring)."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.names = {"localhost", *settings.allowed_hosts}
        self.bind = settings.bind.lower()
        self.loopback = is_loopback(self.bind)
        try:
            self.wildcard = ipaddress.ip_address(self.bind).is_unspecified
        except ValueError:
            self.wildcard = False
            self.names.add(self.bind)

    def allows(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names
        return self.wildcard or host == self.bind or (self.loopback and ip.is_loopback)


class RequestGuard:
    """ASGI middleware: the `Host` check on every request, the `Origin` check on every unsafe one."""

    def __init__(self, app: ASGIApp, settings: ConsoleSettings) -> None:
        self.app = app
        self.policy = HostPolicy(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self.refusal(scope["method"], headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message = refusal
        log.warning("console refused a request", extra={"path": scope.get("path"), "status": status,
                                                        "host": headers.get("host", "")[:200],
                                                        "origin": headers.get("origin", "")[:200]})
        await PlainTextResponse(message + "\n", status_code=status)(scope, receive, send)

    def refusal(self, method: str, headers: Headers) -> tuple[int, str] | None:
        """(status, message) when the request must be refused, None when it may go on."""
        host = split_host(headers.get("host", ""))
        if host is None or not self.policy.allows(host[0]):
            return 421, "this console does not answer to that host name (add it to console.allowed_hosts)"
        if method in SAFE_METHODS or headers.get("authorization", "").lower().startswith("bearer "):
            return None
        origin = headers.get("origin")
        if not origin or not self.same_origin(origin, host):
            return 403, "a change must come from the console's own pages (the Origin header is missing or foreign)"
        return None

    def same_origin(self, origin: str, host: tuple[str, int | None]) -> bool:
        """`origin` names the host (and the port, where `Host` gives one) the request was sent to.
        Its scheme may be either: behind a proxy that terminates TLS the browser's is https."""
        try:
            parts = urlsplit(origin)
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        except ValueError:
            return False
        return (parts.scheme in ("http", "https") and (parts.hostname or "").rstrip(".") == host[0]
                and (host[1] is None or port == host[1]) and parts.path in ("", "/") and not parts.query)


__all__ = ["HostPolicy", "RequestGuard", "split_host"]
