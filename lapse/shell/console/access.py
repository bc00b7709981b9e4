"""Who may use the console and how a form proves it came from the console.

Tokens come from the settings (`console.viewer_tokens`, `console.operator_tokens`, {name: token},
each of a minimum strength); a token's name is the actor recorded with every action taken through
it. A browser signs in once with its token and gets a session: a random id in an HttpOnly,
SameSite=Strict cookie (Secure under TLS) naming a session kept in this process, which signing out
ends (a copied cookie stops working). A script may send `Authorization: Bearer <token>` instead.
Failed sign-ins and bearer tokens are rate-limited per client and overall (`SignInLimits`).

With no token configured the console serves loopback only and is open: whoever reaches it may read,
and acting takes a name the operator gives on the sign-in page, recorded as `local:<name>` (the
console cannot tell local processes apart, so it records who they say they are, never its own OS
user). Every form carries a CSRF token signed for its session, checked on every POST. Tokens are
compared in constant time and never rendered."""

from __future__ import annotations

import ipaddress
import re
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from itsdangerous import BadSignature, URLSafeTimedSerializer

from lapse.kernel.settings import ConsoleSettings

VIEWER, OPERATOR = "viewer", "operator"
SESSION_COOKIE = "lapse_console"
CSRF_FIELD = "csrf_token"
SESSION_MAX_AGE_S = 12 * 3600
CSRF_MAX_AGE_S = 2 * 3600
MAX_SESSIONS = 10_000
# The name an operator gives on the open console: what an actor column can show, nothing else.
LOCAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
LOCAL_PREFIX = "local:"
ANONYMOUS_LOCAL = "local (no name given)"


class AccessRefused(Exception):
    """A request the console refuses: no valid credentials, the wrong role, a bad form token, or
    too many failed sign-ins. `status` is the HTTP status it answers with (401, 403, 429);
    `retry_after_s` is set for 429."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Identity:
    """Who is asking: the actor name recorded with their actions, their role, and the session
    they are signed in with (None: a bearer token, or the open console's anonymous reader)."""

    name: str
    role: str
    session: str | None = None

    @property
    def may_act(self) -> bool:
        return self.role == OPERATOR


def is_loopback(bind: str) -> bool:
    """True for a loopback address or `localhost` (what only this host can reach)."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class SignInLimits:
    """Failed sign-ins (form or bearer token) allowed per client and in all within `window_s`; past
    either, every attempt is refused until the window has moved on, a right token included, so the
    limit is no oracle. In-process and monotonic: it guards this process, changes no stored state."""

    per_client: int = 10
    overall: int = 100
    window_s: float = 60.0
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    _all: deque[float] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _trim(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - self.window_s:
            times.popleft()

    def check(self, client: str) -> None:
        """Raise AccessRefused(429) while `client`, or everyone, is over the limit."""
        now = time.monotonic()
        with self._lock:
            self._trim(self._all, now)
            mine = self._failures.get(client, deque())
            self._trim(mine, now)
            for times, limit in ((mine, self.per_client), (self._all, self.overall)):
                if len(times) >= limit:
                    wait = int(times[0] + self.window_s - now) + 1
                    raise AccessRefused(429, f"too many failed sign-ins: try again in {wait} s", wait)

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            if client not in self._failures and len(self._failures) >= MAX_SESSIONS:
                stale = now - self.window_s
                for known in [c for c, times in self._failures.items() if not times or times[-1] <= stale]:
                    del self._failures[known]
            self._failures.setdefault(client, deque()).append(now)
            self._all.append(now)


class Sessions:
    """Signed-in sessions, kept in this process: random id → (identity, expiry). Signing out ends
    one; at most MAX_SESSIONS live at once (the oldest go first)."""

    def __init__(self) -> None:
        self._live: dict[str, tuple[Identity, float]] = {}
        self._lock = threading.Lock()

    def start(self, name: str, role: str) -> Identity:
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            for old in [s for s, (_, until) in self._live.items() if until <= now]:
                del self._live[old]
            while len(self._live) >= MAX_SESSIONS:
                del self._live[next(iter(self._live))]
            who = Identity(name, role, sid)
            self._live[sid] = (who, now + SESSION_MAX_AGE_S)
        return who

    def get(self, sid: str) -> Identity | None:
        with self._lock:
            found = self._live.get(sid)
        if found is None or found[1] <= time.monotonic():
            return None
        return found[0]

    def end(self, sid: str) -> None:
        with self._lock:
            self._live.pop(sid, None)


class Access:
    """The console's tokens, sessions, sign-in limits and CSRF tokens, from `ConsoleSettings`."""

    def __init__(self, settings: ConsoleSettings, limits: SignInLimits | None = None) -> None:
        key = settings.secret_key.get_secret_value() if settings.secret_key else secrets.token_urlsafe(32)
        self.tokens: dict[str, tuple[str, str]] = {}  # token value → (name, role)
        for role, tokens in ((VIEWER, settings.viewer_tokens), (OPERATOR, settings.operator_tokens)):
            for name, token in tokens.items():
                if token.get_secret_value():
                    self.tokens[token.get_secret_value()] = (name, role)
        self.tls = settings.tls_cert is not None
        self.sessions = Sessions()
        self.limits = limits or SignInLimits()
        self._csrf = URLSafeTimedSerializer(key, salt="lapse-console-csrf")

    @property
    def open(self) -> bool:
        """No token configured: anyone who reaches the console (loopback only) may read, and act
        under the name they give."""
        return not self.tokens

    def check_bind(self, bind: str) -> None:
        """Refuse to serve beyond this host without tokens or without TLS (ValueError, one line)."""
        if is_loopback(bind):
            return
        if self.open:
            raise ValueError(f"the console would serve {bind} with no tokens: configure "
                             "console.viewer_tokens or console.operator_tokens, or bind to 127.0.0.1")
        if not self.tls:
            raise ValueError(f"the console would serve {bind} without TLS, tokens and cookies in the clear: "
                             "configure console.tls_cert and console.tls_key, or bind to 127.0.0.1")

    def by_token(self, token: str, client: str) -> Identity | None:
        """The identity of `token` (None: no such token, counted as a failed sign-in of `client`),
        compared in constant time with each; AccessRefused(429) while `client` is over the limit."""
        self.limits.check(client)
        found = None
        for value, (name, role) in self.tokens.items():
            if secrets.compare_digest(value.encode(), token.encode()):
                found = Identity(name, role)
        if found is None:
            self.limits.failed(client)
        return found

    def sign_in(self, client: str, *, token: str = "", name: str = "") -> Identity | None:
        """A new session for a token, or on the open console for a given name (None: refused)."""
        if self.open:
            if not LOCAL_NAME.fullmatch(name):
                return None
            return self.sessions.start(LOCAL_PREFIX + name, OPERATOR)
        who = self.by_token(token, client) if token else None
        return None if who is None else self.sessions.start(who.name, who.role)

    def identify(self, cookie: str | None, authorization: str | None, client: str) -> Identity | None:
        """Who a request is from: the bearer token, else the session of the cookie, else, on the
        open console, its anonymous reader; None: nobody known."""
        if authorization and authorization.lower().startswith("bearer ") and not self.open:
            return self.by_token(authorization[7:].strip(), client)
        who = self.sessions.get(cookie) if cookie else None
        if who is None and self.open:
            return Identity(ANONYMOUS_LOCAL, VIEWER)
        return who

    def csrf_token(self, who: Identity | None) -> str:
        """A form token for `who`'s session (none: the sign-in form)."""
        return self._csrf.dumps(who.session or "" if who else "")

    def check_csrf(self, who: Identity | None, token: str | None) -> None:
        """Raise AccessRefused(403) unless `token` was signed here for `who`'s session, recently."""
        try:
            session = self._csrf.loads(token or "", max_age=CSRF_MAX_AGE_S)
        except BadSignature:
            raise AccessRefused(403, "the form's CSRF token is missing or wrong: reload the page") from None
        if session != ((who.session or "") if who else ""):
            raise AccessRefused(403, "the form's CSRF token is not this session's: reload the page")


def require_operator(who: Identity, open_console: bool) -> None:
    """Raise AccessRefused(403) unless `who` may act (replay, discard)."""
    if who.may_act:
        return
    if open_console:
        raise AccessRefused(403, "give your name on the sign-in page first: it is recorded with what you do")
    raise AccessRefused(403, f"{who.name} is a viewer: replaying needs an operator token")


__all__ = ["CSRF_FIELD", "OPERATOR", "SESSION_COOKIE", "VIEWER", "Access", "AccessRefused", "Identity",
           "SignInLimits", "is_loopback", "require_operator"]
