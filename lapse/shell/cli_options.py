"""Click options that map onto `Settings` fields, each showing its `LAPSE_*` variable in `--help`.

A flag left unset falls back to the environment, then to the config file, then to the default:
`load_settings` reads the environment and the file (`lapse --config FILE`) once and the flags given on
the command line win.
"""

from __future__ import annotations

import functools
import json
import sys
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, urlsplit

import click
from pydantic import ValidationError

from lapse.kernel.config_file import ConfigFileError
from lapse.kernel.logs import configure_logging, set_role
from lapse.kernel.settings import (
    Settings,
    UnknownSetting,
    env_var,
    field_info,
    load_settings,
    nest,
    setting_origins,
)
from lapse.shell.cli import config_file_option
from lapse.shell.error_boundary import CommandFailed, ExitCode, debug_requested, note_settings
from lapse.shell.time_args import Duration

F = TypeVar("F", bound=Callable[..., Any])

_CLICK_TYPES: dict[Any, click.ParamType] = {int: click.INT, float: click.FLOAT}

# Flags whose name is not `--` + the field's name (the section alone does not say enough).
_FLAGS = {
    "kafka.bootstrap_servers": "--bootstrap-servers",
    "database.url": "--database-url",
    "schemas.registry_url": "--schema-registry-url",
    "topics.file": "--topics-file",
    "topics.prefix": "--topic-prefix",
    "report.dir": "--report-dir",
    "report.notifier": "--notifier",
}


# Flags whose value is a URL that could carry a password: refused when it does, since every user of
# the machine can read a process's arguments (`ps`). What to use instead, per flag.
_NO_PASSWORD_FLAGS = {
    "database.url": f"{env_var('database.url')}, database.url in the config file, or a ~/.pgpass entry",
    "schemas.registry_url": f"{env_var('schemas.registry_auth')} or schemas.registry_auth in the config file",
}
_PASSWORD_QUERY_KEYS = ("password", "sslpassword")


def _refuse_password(path: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback refusing a URL with a password (in its user info or its query) for `path`."""

    def check(_ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if isinstance(value, str):
            try:
                parts = urlsplit(value)
                secret = parts.password is not None or any(
                    key.lower() in _PASSWORD_QUERY_KEYS for key, _ in parse_qsl(parts.query))
            except ValueError:
                secret = False  # not a URL: the setting's own validation says so
            if secret:
                raise click.BadParameter(f"holds a password, which every user of this machine can read in the "
                                         f"process list; set it in {_NO_PASSWORD_FLAGS[path]}", param=param)
        return value

    return check


def _field_type(annotation: Any) -> Any:
    """int or float for `int`, `float` and their optional forms; None for anything else."""
    if annotation in _CLICK_TYPES:
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in _CLICK_TYPES else None


def _choices(annotation: Any) -> list[str]:
    """The values of a `Literal[...]` setting (or an optional one); empty for any other type."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    literal = annotation if typing.get_origin(annotation) is Literal else args[0] if len(args) == 1 else None
    return [str(v) for v in typing.get_args(literal)] if typing.get_origin(literal) is Literal else []


def _param(path: str) -> str:
    """The click parameter name of the setting at dotted `path` (`processor__batch_size`)."""
    return path.replace(".", "__")


def setting_option(path: str, *decls: str, **kwargs: Any) -> Callable[[F], F]:
    """A click option for the setting at dotted `path` (`"processor.batch_size"`); help shows its
    environment variable and default."""
    info = field_info(path)
    decls = decls or (_FLAGS.get(path) or f"--{path.rpartition('.')[2].replace('_', '-')}",)
    help_text = kwargs.pop("help", None) or info.description or ""
    kwargs.setdefault("default", None)
    number = _field_type(info.annotation)
    choices = _choices(info.annotation)
    if choices:
        kwargs.setdefault("type", click.Choice(choices))
    elif path.endswith("_s") and number is float:  # seconds: a duration (30s, 5m, 2h) or a number
        kwargs.setdefault("type", Duration(as_seconds=True))
        kwargs.setdefault("metavar", "DURATION")
    elif number is not None:
        kwargs.setdefault("type", _CLICK_TYPES[number])
    default = info.get_default(call_default_factory=False)
    shown = f"default: {default}; " if isinstance(default, (int, float, str)) and default != "" else ""
    if path in _NO_PASSWORD_FLAGS:
        kwargs.setdefault("callback", _refuse_password(path))
    return click.option(
        *decls, _param(path), help=f"{help_text} [{shown}env: {env_var(path)}]", show_default=False, **kwargs
    )


def log_options(func: F) -> F:
    """`--log-level` and `--log-format`."""
    for path in reversed(["runtime.log_level", "runtime.log_format"]):
        func = setting_option(path)(func)
    return func


def connection_options(func: F) -> F:
    """The flags every command that talks to Kafka and the database accepts, and the log flags."""
    for path in reversed(["kafka.bootstrap_servers", "database.url", "schemas.registry_url", "topics.file",
                          "topics.prefix"]):
        func = setting_option(path)(func)
    return log_options(func)


def build_settings(flags: dict[str, Any]) -> Settings:
    """Settings from flags (dotted paths) + env + the config file, or a one-line error and the
    configuration exit status (3) on a wrong value, naming where the value came from. `lapse --debug`
    turns on `runtime.log_tracebacks`."""
    config_file = config_file_option()
    if debug_requested():
        flags = {**flags, "runtime.log_tracebacks": True}
    try:
        return load_settings(config_file, **nest(flags))
    except (UnknownSetting, ConfigFileError) as exc:
        raise CommandFailed(ExitCode.CONFIG, str(exc)) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][:2]) or "settings"
        origin = setting_origins(config_file, **nest(flags)).get(where, "default")
        source = origin if origin.startswith("env ") else f"{origin} (env {env_var(where)})"
        why = first["msg"].removeprefix("Value error, ")
        raise CommandFailed(ExitCode.CONFIG, f"invalid setting {where} from {source}: {why}") from None


def pass_settings(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the setting flags of a command into one `settings` argument."""

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        flags = {k.replace("__", "."): kwargs.pop(k) for k in list(kwargs) if "__" in k}
        settings = build_settings(flags)
        note_settings(settings)
        ctx = click.get_current_context(silent=True)
        set_role(ctx.command_path.partition(" ")[2] if ctx is not None else "")
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
