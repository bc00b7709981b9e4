"""Secrets shown masked: the effective settings as plain, printable values with every secret hidden.

What is a secret: every `SecretStr` field; the password and secret-looking query values of a URL
(the database URL stays readable: which host and database is the point of showing it); and any
`kafka.extra` key that names a secret (`lapse.kernel.secret_keys`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import BaseModel, SecretStr

from lapse.kernel.secret_keys import is_secret_key

MASK = "********"


def mask_url(url: str) -> str:
    """`url` with its password and any secret-named query value masked; all of it masked when it
    cannot be parsed (a password that is not percent-encoded can make a URL ambiguous)."""
    try:
        parts = urlsplit(url)
        password = parts.password
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return MASK
    if "@" in parts.path + parts.query + parts.fragment:  # a password with a raw '/', '?' or '#' in it
        return MASK
    shown = url
    if password is not None:
        userinfo, _, hostport = parts.netloc.rpartition("@")
        shown = shown.replace(parts.netloc, f"{userinfo.partition(':')[0]}:{MASK}@{hostport}", 1)
    if any(is_secret_key(key) for key, _ in query):
        masked_query = urlencode([(k, MASK if is_secret_key(k) else v) for k, v in query], safe="*")
        shown = shown.replace(f"?{parts.query}", f"?{masked_query}", 1)
    return shown


def masked(name: str, value: Any) -> Any:
    """A JSON-friendly form of the field `name`'s `value`, secrets masked."""
    if isinstance(value, SecretStr):
        return mask_url(value.get_secret_value()) if _is_url(name) else MASK
    if isinstance(value, str) and _is_url(name):
        return mask_url(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: MASK if is_secret_key(str(k)) else masked(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(name, v) for v in value]
    return value


def masked_settings(settings: BaseModel) -> dict[str, dict[str, Any]]:
    """Every field of every section of `settings`, by section and field name, secrets masked."""
    return {
        section: {field: masked(field, getattr(values, field)) for field in type(values).model_fields}
        for section in type(settings).model_fields
        for values in [getattr(settings, section)]
    }


def _is_url(name: str) -> bool:
    return name == "url" or name.endswith("_url")
