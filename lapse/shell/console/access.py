"""Who may use the console and how a form proves it came from the console.

Tokens come from the settings (`console.viewer_tokens`, `console.operator_tokens`, {name: token});
a token's name is the actor recorded with every action taken through it. With no token configured
the console serves loopback only, and whoever reaches it is an operator named after the OS user
(`console:<user>`). A browser signs in once with its token and gets a signed session cookie; a
script may send `Authorization: Bearer <token>` instead. Every form carries a CSRF token signed
for the session's actor, checked on every POST. Tokens are compared in constant time and never
rendered."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

from lapse.kernel.settings import ConsoleSettings
from lapse.operator_actions import os_user

VIEWER, OPERATOR = "viewer", "operator"
SESSION_COOKIE = "lapse_console"
CSRF_FIELD = "csrf_token"
SESSION_MAX_AGE_S = 12 * 3600
CSRF_MAX_AGE_S = 2 * 3600


class AccessRefused(Exception):
    """A request the console refuses: no valid credentials, the wrong role, or a bad form token.
    `status` is the HTTP status it answers with (401, 403)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Identity:
    """Who is asking: the actor name recorded with their actions, and their role."""

    name: str
    role: str

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


class Access:
    """The console's tokens, session cookies and CSRF tokens, from `ConsoleSettings`."""

    def __init__(self, settings: ConsoleSettings) -> None:
        key = settings.secret_key.get_secret_value() if settings.secret_key else secrets.token_urlsafe(32)
        self.tokens: dict[str, tuple[str, str]] = {}  # token value → (name, role)
        # name → a keyed digest of its token: a session outlives neither its token nor a new one.
        self._versions: dict[str, str] = {}
        for role, tokens in ((VIEWER, settings.viewer_tokens), (OPERATOR, settings.operator_tokens)):
            for name, token in tokens.items():
                if token.get_secret_value():
                    self.tokens[token.get_secret_value()] = (name, role)
                    self._versions[name] = hmac.new(key.encode(), token.get_secret_value().encode(),
                                                    hashlib.sha256).hexdigest()[:32]
        self._sessions = URLSafeTimedSerializer(key, salt="lapse-console-session")
        self._csrf = URLSafeTimedSerializer(key, salt="lapse-console-csrf")

    @property
    def open(self) -> bool:
        """No token configured: anyone who reaches the console (loopback only) is an operator."""
        return not self.tokens

    def check_bind(self, bind: str) -> None:
        """Refuse to serve beyond this host without tokens (ValueError, one line)."""
        if self.open and not is_loopback(bind):
            raise ValueError(f"the console would serve {bind} with no tokens: configure "
                             "console.viewer_tokens or console.operator_tokens, or bind to 127.0.0.1")

    def by_token(self, token: str) -> Identity | None:
        """The identity of `token` (None: no such token), compared in constant time with each."""
        found = None
        for value, (name, role) in self.tokens.items():
            if secrets.compare_digest(value.encode(), token.encode()):
                found = Identity(name, role)
        return found

    def session_cookie(self, who: Identity) -> str:
        """The signed cookie value of a signed-in identity."""
        return self._sessions.dumps([who.name, self._versions.get(who.name, "")])

    def identify(self, cookie: str | None, authorization: str | None) -> Identity | None:
        """Who a request is from: the bearer token, else the session cookie (whose name must still
        have a token), else, on an open console, the OS user; None: nobody known."""
        if self.open:
            return Identity(f"console:{os_user()}", OPERATOR)
        if authorization and authorization.lower().startswith("bearer "):
            return self.by_token(authorization[7:].strip())
        if not cookie:
            return None
        try:
            name, version = self._sessions.loads(cookie, max_age=SESSION_MAX_AGE_S)
        except (BadSignature, TypeError, ValueError):
            return None
        if not secrets.compare_digest(str(self._versions.get(name, "")), str(version)) or not version:
            return None
        return next((Identity(n, role) for n, role in self.tokens.values() if n == name), None)

    def csrf_token(self, who: Identity | None) -> str:
        """A form token for `who` (anonymous: the sign-in form)."""
        return self._csrf.dumps(who.name if who else "")

    def check_csrf(self, who: Identity | None, token: str | None) -> None:
        """Raise AccessRefused(403) unless `token` was signed here for `who`, recently."""
        try:
            name = self._csrf.loads(token or "", max_age=CSRF_MAX_AGE_S)
        except BadSignature:
            raise AccessRefused(403, "the form's CSRF token is missing or wrong: reload the page") from None
        if name != (who.name if who else ""):
            raise AccessRefused(403, "the form's CSRF token is not this session's: reload the page")


def require_operator(who: Identity) -> None:
    """Raise AccessRefused(403) unless `who` may act (replay)."""
    if not who.may_act:
        raise AccessRefused(403, f"{who.name} is a viewer: replaying needs an operator token")


__all__ = ["CSRF_FIELD", "OPERATOR", "SESSION_COOKIE", "VIEWER", "Access", "AccessRefused", "Identity",
           "is_loopback", "require_operator"]
