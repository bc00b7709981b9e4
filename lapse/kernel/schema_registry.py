"""The codec's schema registry client: register a schema, fetch a schema by id.

HTTP, basic or bearer authentication and TLS (a CA, a client certificate) are
`confluent_kafka.schema_registry.SchemaRegistryClient`'s, configured with its own keys
(lapse.kernel.connections maps the settings to them). Kept here, in front of it:
- a negative cache: the library asks again for every id it was told is unknown, so an id the
  registry answered 404 for is taken as unknown for `NOT_FOUND_TTL_S` and a run of records with one
  unknown id costs one request, not one each;
- the ids and schemas this client registered or fetched, answered before the library is asked (its
  cache is per subject, and the codec fetches by id alone), so `requests` counts real requests;
- the errors: the library raises its own error for an HTTP failure and the HTTP library's for a
  network one, with multi-line bodies; each becomes one `SchemaRegistryError` (status, error code)
  whose one-line message never holds a credential;
- no retries inside a call: the library's are turned off, Lapse's outage handling backs off instead.
A bearer token is the library's static token, which it sends only with a logical cluster id: Lapse
has none to give, so that header goes empty (a registry that does not route by it ignores it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

# How long an id the registry answered 404 for is taken as unknown without asking again (seconds):
# long enough to absorb a burst of records with that id, short enough that an id registered
# afterwards is found soon.
NOT_FOUND_TTL_S = 60.0
# At most this many unknown ids are remembered (hostile records can carry any id); the oldest goes.
NOT_FOUND_MAX = 10_000
# Library configuration keys whose values are secrets (masked in every message).
SECRET_KEYS = ("basic.auth.user.info", "bearer.auth.token", "ssl.key.password")
# Longest registry-supplied error text kept in a message.
MESSAGE_MAX = 300


class SchemaRegistryError(Exception):
    """A registry call failed; `status` is the HTTP status (None for network errors/timeouts)."""

    def __init__(self, message: str, status: int | None = None, error_code: int | None = None):
        super().__init__(message)
        self.status = status
        self.error_code = error_code

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def transient(self) -> bool:
        """True when retrying later may help (network error, timeout, 5xx, 429)."""
        return self.status is None or self.status >= 500 or self.status == 429


class SchemaRegistryClient:
    """Registers schemas under a subject and resolves schema ids, caching both directions."""

    def __init__(self, url: str, auth: str | None = None, timeout_s: float = 5.0, *,
                 bearer_token: str | None = None, config: Mapping[str, Any] | None = None,
                 not_found_ttl_s: float = NOT_FOUND_TTL_S, clock: Callable[[], float] = time.monotonic):
        """`auth` is basic auth as user:password; `bearer_token` a token sent instead (not both).
        `config` holds more of the library's keys (the `ssl.*` of an https registry). A configuration
        the library refuses raises ValueError (one line)."""
        self.url = _printable(url)
        self.not_found_ttl_s = not_found_ttl_s
        self.clock = clock
        self.requests = 0  # requests made through the library (each miss of this client's caches)
        # function-local: the library (authlib, httpx) costs a third of a second to import, paid only
        # by processes that talk to a registry, not by every role of the registry-free default
        from confluent_kafka import schema_registry as library
        from confluent_kafka.schema_registry.common._httpx_compat import httpx  # the HTTP library it uses

        self._library, self._transport_errors = library, (httpx.TransportError, OSError)
        extra = {**auth_config(auth, bearer_token), **(config or {})}
        self._secrets = _secrets_of(url, extra)
        try:
            self._client = library.SchemaRegistryClient({**extra, "url": url, "timeout": timeout_s,
                                                         "max.retries": 0})
        except (ValueError, TypeError, OSError) as exc:  # a bad key, a certificate that does not load
            raise ValueError(self._masked(f"schema registry {self.url}: {exc}")) from None
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, str] = {}
        self._not_found: dict[int, tuple[float, SchemaRegistryError]] = {}  # id → (until, the 404)
        self._lock = threading.Lock()

    def register(self, subject: str, schema_json: str) -> int:
        """The id of `schema_json` under `subject`, registering it if needed (idempotent)."""
        key = (subject, schema_json)
        cached = self._ids.get(key)
        if cached is not None:
            return cached
        schema_id = self._call(f"POST /subjects/{subject}/versions",
                               lambda: self._client.register_schema(subject, self._library.Schema(schema_json, "AVRO")))
        if not isinstance(schema_id, int):
            raise SchemaRegistryError(f"schema registry POST /subjects/{subject}/versions: no id in the answer")
        with self._lock:
            self._ids[key] = schema_id
            self._schemas.setdefault(schema_id, schema_json)
        return schema_id

    def schema_by_id(self, schema_id: int) -> str:
        """The schema text registered under `schema_id` (raises with status 404 if unknown)."""
        cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        missing = self._not_found.get(schema_id)
        if missing is not None and self.clock() < missing[0]:
            raise SchemaRegistryError(str(missing[1]), missing[1].status, missing[1].error_code)
        what = f"GET /schemas/ids/{schema_id}"
        try:
            schema_json = self._call(what, lambda: self._client.get_schema(schema_id).schema_str)
        except SchemaRegistryError as exc:
            if exc.not_found:
                with self._lock:
                    self._not_found.pop(schema_id, None)
                    if len(self._not_found) >= NOT_FOUND_MAX:
                        del self._not_found[next(iter(self._not_found))]
                    self._not_found[schema_id] = (self.clock() + self.not_found_ttl_s, exc)
            raise
        if not isinstance(schema_json, str):
            raise SchemaRegistryError(f"schema registry {what}: no schema in the answer")
        with self._lock:
            self._schemas[schema_id] = schema_json
            self._not_found.pop(schema_id, None)
        return schema_json

    def close(self) -> None:
        """Close the library's HTTP session (the client is unusable afterwards)."""
        self._client.close()

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        """`call` through the library, its failures as one-line `SchemaRegistryError`s."""
        self.requests += 1
        try:
            return call()
        except self._library.SchemaRegistryError as exc:
            code = exc.error_code if isinstance(exc.error_code, int) and exc.error_code != -1 else None
            status = exc.http_status_code if isinstance(exc.http_status_code, int) else None
            message = self._masked(f"schema registry {what}: HTTP {status}: {exc.error_message}")
            raise SchemaRegistryError(message, status, code) from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # an answer that is not the API's
            message = self._masked(f"schema registry {what}: bad answer: {type(exc).__name__}: {exc}")
            raise SchemaRegistryError(message) from None
        except self._transport_errors as exc:  # refused, DNS, timeout, reset, TLS
            reason = str(exc) or type(exc).__name__
            raise SchemaRegistryError(self._masked(f"schema registry {self.url} unreachable: {reason}")) from None

    def _masked(self, message: str) -> str:
        """`message` on one line, shortened, with every credential this client holds replaced."""
        for secret in self._secrets:
            message = message.replace(secret, "***")
        message = " ".join(message.split())
        return message if len(message) <= MESSAGE_MAX else message[:MESSAGE_MAX] + "…"


def auth_config(auth: str | None = None, bearer_token: str | None = None) -> dict[str, str]:
    """The library's keys for basic auth (user:password) or a bearer token (not both)."""
    if auth and bearer_token:
        raise ValueError("schema registry: give basic auth or a bearer token, not both")
    if auth:
        return {"basic.auth.user.info": auth}
    if bearer_token:
        # The library sends a static token only with a logical cluster id (the header a multi-tenant
        # registry routes by); Lapse has none to give, and a registry that does not route ignores it.
        return {"bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": bearer_token,
                "bearer.auth.logical.cluster": ""}
    return {}


def _printable(url: str) -> str:
    """`url` without user information (credentials written into it never reach a message)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url.rstrip("/")
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)).rstrip("/")


def _secrets_of(url: str, config: Mapping[str, Any]) -> list[str]:
    """Every credential in `url` and `config`, longest first, as it could appear in a message: whole,
    and a basic auth's password on its own."""
    found: list[str] = []
    parts = urlsplit(url)
    user, password = parts.username or "", parts.password or ""
    for value in (password and f"{user}:{password}", password, unquote(password),
                  *(config.get(key) for key in SECRET_KEYS)):
        if isinstance(value, str) and value:
            found.append(value)
    auth = config.get("basic.auth.user.info")
    if isinstance(auth, str) and ":" in auth and auth.split(":", 1)[1]:
        found.append(auth.split(":", 1)[1])
    return sorted(set(found), key=len, reverse=True)
