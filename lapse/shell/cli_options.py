"""Click options that map onto `Settings` fields, each showing its `LAPSE_*` variable in `--help`.

A flag left unset falls back to the environment, then to the default: `load_settings` reads the
environment once and the flags given on the command line win.
"""

from __future__ import annotations

import functools
import json
import sys
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from lapse.kernel.logs import configure_logging
from lapse.kernel.settings import Settings, env_var, load_settings

_CLICK_TYPES = {int: click.INT, float: click.FLOAT}

F = TypeVar("F", bound=Callable[..., Any])


def _field_type(annotation: Any) -> Any:
    """int or float for `int`, `float` and their optional forms; None for anything else."""
    if annotation in _CLICK_TYPES:
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in _CLICK_TYPES else None


def setting_option(field: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    """A click option for Settings field `field`; help shows the field's env var and default."""
    info = Settings.model_fields[field]
    decls = decls or (f"--{field.replace('_', '-')}",)
    help_text = kwargs.pop("help", None) or info.description or ""
    kwargs.setdefault("default", None)
    number = _field_type(info.annotation)
    if number is not None:
        kwargs.setdefault("type", _CLICK_TYPES[number])
    default = info.get_default(call_default_factory=False)
    shown = f"default: {default}; " if isinstance(default, (int, float, str)) and default != "" else ""
    return click.option(
        *decls, field, help=f"{help_text} [{shown}env: {env_var(field)}]", show_default=False, **kwargs
    )


def connection_options(func: F) -> F:
    """The flags every command that talks to Kafka and the database accepts."""
    for opt in reversed(
        [
            setting_option("bootstrap_servers"),
            setting_option("database_url"),
            setting_option("schema_registry_url"),
            setting_option("log_level"),
        ]
    ):
        func = opt(func)
    return func


def build_settings(**flags: Any) -> Settings:
    """Settings from env + flags, or a one-line error and exit status 2 on a wrong value."""
    known = {k: v for k, v in flags.items() if k in Settings.model_fields}
    try:
        return load_settings(**known)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        var = env_var(where) if where in Settings.model_fields else where
        raise click.UsageError(f"invalid setting {where} ({var}): {first['msg']}") from None


def pass_settings(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the setting flags of a command into one `settings` argument."""

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        setting_values = {k: kwargs.pop(k) for k in list(kwargs) if k in Settings.model_fields}
        settings = build_settings(**setting_values)

        configure_logging(settings)
        return func(settings=settings, **kwargs)

    return wrapper


def emit(data: Any, as_json: bool, text: Callable[[Any], str] | None = None) -> None:
    """Print `data` as one JSON object (for machines) or as text (for people)."""
    if as_json:
        sys.stdout.write(json.dumps(data, default=str, sort_keys=True) + "\n")
    else:
        sys.stdout.write((text(data) if text else str(data)) + "\n")
    sys.stdout.flush()
