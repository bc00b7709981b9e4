"""A small Confluent schema registry client: register a schema, fetch a schema by id.

Only the two calls the codec needs, over urllib so Lapse takes no extra dependency (the
`confluent_kafka.schema_registry` client needs the authlib and cachetools packages). It authenticates
with basic auth or a bearer token and speaks TLS with the context it is given (a custom CA, a client
certificate: lapse.kernel.connections builds it from the settings). Results are
cached (a schema id never changes its schema); so, for `NOT_FOUND_TTL_S`, is an id the registry
does not know, so a run of records with one unknown id costs one request, not one each. Every HTTP
or network failure becomes one `SchemaRegistryError` with a one-line message.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
# How long an id the registry answered 404 for is taken as unknown without asking again (seconds):
# long enough to absorb a burst of records with that id, short enough that an id registered
# afterwards is found soon.
NOT_FOUND_TTL_S = 60.0
# At most this many unknown ids are remembered (hostile records can carry any id); the oldest goes.
NOT_FOUND_MAX = 10_000


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
                 bearer_token: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 not_found_ttl_s: float = NOT_FOUND_TTL_S, clock: Callable[[], float] = time.monotonic):
        """`auth` is basic auth as user:password; `bearer_token` a token sent instead (not both).
        `ssl_context` verifies an https registry (and presents a client certificate)."""
        if auth and bearer_token:
            raise ValueError("schema registry: give basic auth or a bearer token, not both")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self.not_found_ttl_s = not_found_ttl_s
        self.clock = clock
        self.requests = 0  # HTTP requests made (each cache miss is one)
        self._headers = {"Accept": CONTENT_TYPE, "Content-Type": CONTENT_TYPE}
        if auth:
            token = base64.b64encode(auth.encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        elif bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
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
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        body = self._call("POST", path, {"schema": schema_json, "schemaType": "AVRO"})
        schema_id = body.get("id")
        if not isinstance(schema_id, int):
            raise SchemaRegistryError(f"schema registry: no id in the answer to POST {path}")
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
        path = f"/schemas/ids/{schema_id}"
        try:
            schema_json = self._call("GET", path, None).get("schema")
        except SchemaRegistryError as exc:
            if exc.not_found:
                with self._lock:
                    self._not_found.pop(schema_id, None)
                    if len(self._not_found) >= NOT_FOUND_MAX:
                        del self._not_found[next(iter(self._not_found))]
                    self._not_found[schema_id] = (self.clock() + self.not_found_ttl_s, exc)
            raise
        if not isinstance(schema_json, str):
            raise SchemaRegistryError(f"schema registry: no schema in the answer to GET {path}")
        with self._lock:
            self._schemas[schema_id] = schema_json
            self._not_found.pop(schema_id, None)
        return schema_json

    def _call(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=self._headers)
        self.requests += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.ssl_context) as response:
                answer = json.loads(response.read() or b"{}")
            if not isinstance(answer, dict):
                raise ValueError(f"expected a JSON object, got {type(answer).__name__}")
            return answer
        except urllib.error.HTTPError as exc:
            message, code = _error_detail(exc)
            raise SchemaRegistryError(
                f"schema registry {method} {path}: HTTP {exc.code}: {message}", exc.code, code
            ) from None
        except (urllib.error.URLError, OSError) as exc:  # refused, DNS, timeout, reset
            reason = getattr(exc, "reason", exc)
            raise SchemaRegistryError(f"schema registry {self.url} unreachable: {reason}") from None
        except ValueError as exc:  # the answer was not JSON
            raise SchemaRegistryError(f"schema registry {method} {path}: bad answer: {exc}") from None


def _error_detail(exc: urllib.error.HTTPError) -> tuple[str, int | None]:
    """The registry's own error message and error_code, or the HTTP reason when it sent none."""
    try:
        body = json.loads(exc.read() or b"{}")
        return str(body.get("message") or exc.reason), body.get("error_code")
    except (ValueError, OSError, AttributeError):
        return str(exc.reason), None
