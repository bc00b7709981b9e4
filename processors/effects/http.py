"""The caller of a declared `http` effect: one request per operation through one httpx client.

The URL comes from the declared template; the op key goes out as `Idempotency-Key` (the same on
every attempt, so the far side can drop a repeat after a lease takeover) with `Lapse-Attempt`,
and a JSON body names the operation. The answer, or the way the request failed, becomes a
failure class: whether the request was sent decides between temporary and ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from lapse.kernel.kinds.effects import EffectCall, HttpEffect, fill_url
from lapse.kernel.text import one_line
from lapse.processors.effects.base import CallerSetup
from lapse.processors.failures import (
    AMBIGUOUS,
    INVALID,
    TEMPORARY,
    EffectFailure,
    for_status,
    retry_after_wait,
)


def render_url(template: str, call: EffectCall) -> str:
    """The template filled from op_key, subject_id, tenant and the row's columns
    (`lapse.kernel.kinds.effects.http.fill_url`, which the preview shows too); a name with no
    value, or a value that would make a path segment empty, `.` or `..`, makes the call invalid."""
    values: Mapping[str, Any] = {**call.target, "op_key": call.op_key, "subject_id": call.subject_id,
                                 "tenant": call.tenant}
    try:
        return fill_url(template, values)
    except ValueError as exc:
        raise EffectFailure(INVALID, str(exc)) from None


class HttpCaller:
    """Runs the calls of one kind's `http` effect; one client (its connection pool) per kind."""

    def __init__(self, effect: HttpEffect) -> None:
        self.effect = effect
        self.client = httpx.Client(headers=effect.headers, timeout=effect.timeout_s, follow_redirects=False)

    def endpoint(self, call: EffectCall) -> str:
        """The host and port the call goes to ('?' when its URL cannot be made: the call is invalid)."""
        try:
            return host_of(render_url(self.effect.url, call))
        except EffectFailure:
            return "?"

    def __call__(self, call: EffectCall) -> None:
        url = render_url(self.effect.url, call)
        where = host_of(url)
        try:
            with self.client.stream(
                    self.effect.method, url,
                    headers={"Idempotency-Key": call.op_key, "Lapse-Attempt": str(call.attempt)},
                    json={"op_key": call.op_key, "kind": call.kind, "subject_id": call.subject_id,
                          "tenant": call.tenant, "attempt": call.attempt}) as response:
                status = response.status_code
                if 200 <= status < 300:
                    read_some(response, 65536)  # a body read to its end lets the connection be reused
                    return
                reason = f"HTTP {status} {one_line(response.reason_phrase, 40)} from {self.effect.method} {where}"
                body = body_excerpt(response)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise transport_failure(exc, self.effect.method, where) from None
        retry_after = retry_after_wait(response.headers.get("Retry-After"), response.headers.get("Date"))
        failure = for_status(status, reason + (f": {body}" if body else ""), retry_after)
        if failure is not None:
            raise failure

    def close(self) -> None:
        self.client.close()


def host_of(url: str) -> str:
    """Host and port of `url` for a failure reason: never its user info, path or query, which
    may hold credentials."""
    try:
        parts = urlsplit(url)
        return one_line(f"{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else ""), 80)
    except ValueError:
        return "?"


def read_some(response: httpx.Response, limit: int) -> bytes:
    """At most about `limit` bytes of the body: the rest is never read (a hostile or broken far
    side may send a lot), and a body that fails to arrive ends the read (the status is known)."""
    chunk = b""
    try:
        for part in response.iter_bytes():
            chunk += part
            if len(chunk) >= limit:
                break
    except httpx.HTTPError:
        pass
    return chunk[:limit]


def body_excerpt(response: httpx.Response) -> str:
    """The start of an error answer's body as one short line."""
    return one_line(read_some(response, 512).decode("utf-8", "replace"), 120)


def transport_failure(exc: Exception, method: str, where: str) -> EffectFailure:
    """The failure class of a request that got no answer. Not sent (no connection, connect or
    pool timeout) is temporary; a request that cannot be made (bad URL or header value) invalid;
    sent and then timed out or cut off ambiguous: the far side may have acted on it. The
    reason names the error, and the network message only for network errors (a header or URL
    error's message may quote a token)."""
    reason = f"{type(exc).__name__} on {method} {where}"
    if isinstance(exc, (httpx.InvalidURL, httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
        return EffectFailure(INVALID, reason)
    reason += f": {one_line(str(exc), 120)}" if str(exc) else ""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError)):
        return EffectFailure(TEMPORARY, reason)
    return EffectFailure(AMBIGUOUS, reason)


def build(declared: HttpEffect, setup: CallerSetup) -> HttpCaller:
    """The caller of a declared `http` effect: one `HttpCaller` per kind."""
    return HttpCaller(declared)
