"""The one error boundary of the `lapse` command: whatever escapes a command becomes one line on
stderr and a documented exit code (`ExitCode`; the "Exit codes" table of docs/troubleshooting.md).

A wrong input, an invalid configuration, an unreachable dependency (Kafka, the database, the
schema registry), a missing or unreadable file: `lapse: <what>: <why>`, one line, bounded, with
secrets masked and no traceback, SQL or parameters. Anything else is an internal error: one line
ending "run with --debug for the traceback" (`lapse --debug …`, or LAPSE_RUNTIME__LOG_LEVEL=DEBUG,
prints it above the line). Long-running roles keep their own retries; only what escapes them
reaches the boundary.

Commands refuse with `CommandFailed(code, message)`. A plain `click.ClickException` raised while
handling a known error (`raise click.ClickException(str(exc)) from None`) keeps its message and
gets the code of the error it replaced, so every command's refusals share the table.
"""

from __future__ import annotations

import contextvars
import re
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import click

from lapse.kernel.text import one_line
from lapse.shell.masking import MASK, mask_url

if TYPE_CHECKING:
    from lapse.kernel.settings import Settings

# The longest line the boundary prints; a longer message is cut (after masking) and marked.
MAX_LINE_CHARS = 500
CAUSES_FOLLOWED = 5


class ExitCode(IntEnum):
    """What the exit status of `lapse` means (the "Exit codes" table of docs/troubleshooting.md)."""

    OK = 0
    PROBLEM_FOUND = 1   # a check found a problem: an audit invariant broken, a kinds check failed, drift
    USAGE = 2           # a wrong option, value or request (click's own usage errors too)
    CONFIG = 3          # invalid configuration: a setting, the config, kinds or topics file, a file it names
    UNREACHABLE = 4     # a dependency could not be reached: Kafka, the database, the schema registry
    INTERRUPTED = 5     # interrupted (Ctrl-C) or timed out
    INTERNAL = 70       # an unexpected error: a bug to report, with the --debug traceback


class CommandFailed(click.ClickException):
    """A command's one-line refusal with its exit code: `raise CommandFailed(ExitCode.CONFIG, "…")`."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.exit_code = int(code)


@dataclass(frozen=True)
class Diagnosis:
    """What the boundary prints and returns for one exception."""

    code: ExitCode
    line: str


@dataclass
class _Invocation:
    """What the boundary knows about the command running now: whether to show tracebacks, and
    its settings (to name the Kafka servers or database a failure is about)."""

    debug: bool = False
    settings: Settings | None = None


_CURRENT: contextvars.ContextVar[_Invocation | None] = contextvars.ContextVar("lapse_invocation", default=None)


def note_settings(settings: Settings) -> None:
    """Called with a command's settings once they are read (`pass_settings`)."""
    invocation = _CURRENT.get()
    if invocation is not None:
        invocation.settings = settings


def note_debug() -> None:
    """Called by `lapse --debug`: print the traceback of an error above its line."""
    invocation = _CURRENT.get()
    if invocation is not None:
        invocation.debug = True


def debug_requested() -> bool:
    """Whether the command running now was given `lapse --debug`."""
    invocation = _CURRENT.get()
    return invocation is not None and invocation.debug


# --- one line ---------------------------------------------------------------------------------

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+")
_USERINFO = re.compile(r"(://[^\s:/@]*):\S*@")
_SECRET_ASSIGNMENT = re.compile(r"(?i)\b(password|passwd|pwd|secret)(\s*[=:]\s*)\S+")


def masked_line(text: str, secrets: Sequence[str] = ()) -> str:
    """`text` as one bounded line (`lapse.kernel.text.one_line`, cut to MAX_LINE_CHARS), every URL's
    password, `password=…` value and each of `secrets` masked first, so a cut never leaves part of
    a secret."""
    for secret in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = _URL.sub(lambda m: mask_url(m.group(0)), text)
    text = _USERINFO.sub(rf"\1:{MASK}@", text)
    text = _SECRET_ASSIGNMENT.sub(rf"\1\2{MASK}", text)
    return one_line(text, MAX_LINE_CHARS)


def _first_line(exc: BaseException) -> str:
    """The first non-empty line of `exc`'s message (drivers put SQL and hints on later lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


# --- what an exception means ------------------------------------------------------------------

def _kafka_codes(*names: str) -> frozenset[int]:
    from confluent_kafka import KafkaError  # function-local: keeps `lapse --help` fast

    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


_KAFKA_UNREACHABLE = ("_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE", "_MSG_TIMED_OUT",
                      "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "_WAIT_COORD", "COORDINATOR_NOT_AVAILABLE",
                      "NOT_COORDINATOR", "BROKER_NOT_AVAILABLE", "LEADER_NOT_AVAILABLE", "_TIMED_OUT_QUEUE")
_KAFKA_CONFIG = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL", "TOPIC_AUTHORIZATION_FAILED",
                 "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED", "_INVALID_ARG", "_INVALID_TYPE",
                 "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_PARTITION", "UNSUPPORTED_SASL_MECHANISM",
                 "ILLEGAL_SASL_STATE", "_NOT_CONFIGURED")
# PostgreSQL SQLSTATEs that say the configuration is wrong rather than the server away, with what
# to do when the driver's message does not say it.
_PG_CONFIG = {"28P01": "", "28000": "", "3D000": "", "42501": "",
              "42P01": "run `lapse db upgrade`", "3F000": "run `lapse db upgrade`"}
_PG_TIMEOUT = {"57014"}  # query_canceled: statement_timeout
# A connection that failed with no SQLSTATE (libpq reports it as text only) because the server
# refused what the configuration says (credentials, database, role, TLS files) or libpq refused
# the URL itself: the server was reached, or there is nothing to reach, so this is not an outage.
# libpq's and the server's English messages (a server or client with other lc_messages falls back
# to "unreachable").
_PG_CONNECT_CONFIG = re.compile(
    r"password authentication failed|no password supplied|authentication failed for user"
    r'|(database|role) "[^"]*" does not exist|no pg_hba\.conf entry|permission denied for database'
    r"|invalid (port number|sslmode value|connection option|integer value|value for parameter)"
    r"|could not (read|load) (root certificate|certificate|private key)"
    r"|server does not support SSL, but SSL was required|certificate verify failed", re.IGNORECASE)


def _kafka(exc: BaseException, settings: Settings | None) -> tuple[ExitCode, str, str] | None:
    from confluent_kafka import KafkaError, KafkaException  # function-local: keeps `lapse --help` fast

    from lapse.kernel.kafka_clients import DeliveryFailed

    where = f"kafka at {settings.kafka.bootstrap_servers}" if settings is not None else "kafka"
    if isinstance(exc, DeliveryFailed):
        if exc.permanent:
            return ExitCode.INTERNAL, where, _first_line(exc)
        return ExitCode.UNREACHABLE, f"{where} unreachable", _first_line(exc)
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if not isinstance(err, KafkaError):
        return (ExitCode.INTERNAL, where, _first_line(exc)) if isinstance(exc, KafkaException) else None
    why = err.str() or err.name()
    if err.code() in _kafka_codes(*_KAFKA_UNREACHABLE):
        return ExitCode.UNREACHABLE, f"{where} unreachable", why
    if err.code() in _kafka_codes(*_KAFKA_CONFIG):
        return ExitCode.CONFIG, where, why
    return (ExitCode.UNREACHABLE if err.retriable() else ExitCode.INTERNAL), where, why


def _database(exc: BaseException, settings: Settings | None) -> tuple[ExitCode, str, str] | None:
    # function-local: keeps `lapse --help` fast
    import sqlite3

    import psycopg
    from sqlalchemy import exc as sa

    from lapse.kernel.database import DatabaseNotConfigured
    from lapse.kernel.outages import database_outage

    where = "database"
    if settings is not None and "url" in settings.database.model_fields_set:
        where = f"database {mask_url(settings.database.url_plain())}"
    if isinstance(exc, DatabaseNotConfigured):
        return ExitCode.CONFIG, "", str(exc)
    if isinstance(exc, (sa.ArgumentError, sa.NoSuchModuleError)):
        return ExitCode.CONFIG, "database URL", _first_line(exc)
    if isinstance(exc, sa.TimeoutError):
        return ExitCode.INTERRUPTED, f"{where} timed out", _first_line(exc)
    if isinstance(exc, sa.DBAPIError):
        orig: BaseException = exc.orig if isinstance(exc.orig, BaseException) else exc
    elif isinstance(exc, (psycopg.Error, sqlite3.Error)):
        orig = exc
    else:
        return None
    why = _first_line(orig)
    state = getattr(orig, "sqlstate", None)
    if state in _PG_CONFIG or why.startswith("no such table"):
        hint = _PG_CONFIG.get(state or "42P01")
        return ExitCode.CONFIG, where, f"{why}; {hint}" if hint else why
    if state in _PG_TIMEOUT:
        return ExitCode.INTERRUPTED, f"{where} timed out", why
    if state is None and isinstance(orig, psycopg.Error) and _PG_CONNECT_CONFIG.search(str(orig)):
        return ExitCode.CONFIG, where, why
    if isinstance(orig, sqlite3.OperationalError) and why == "unable to open database file":
        return ExitCode.CONFIG, where, f"{why}: the file's folder or the file cannot be opened"
    away = (sa.OperationalError, sa.InterfaceError, psycopg.OperationalError, psycopg.InterfaceError,
            sqlite3.OperationalError)
    if isinstance(exc, away) or isinstance(orig, away):
        return ExitCode.UNREACHABLE, f"{where} unreachable", why
    if (outage := database_outage(exc)) is not None:  # read-only: a failover, or a replica
        return ExitCode.UNREACHABLE, f"{where} unavailable ({outage})", why
    return ExitCode.INTERNAL, where, why


def _configuration(exc: BaseException, _settings: Settings | None) -> tuple[ExitCode, str, str] | None:
    # function-local: keeps `lapse --help` fast
    from pydantic import ValidationError

    from lapse.kernel.config_file import ConfigFileError
    from lapse.kernel.connections import ConnectionRefused
    from lapse.kernel.kinds import KindsFileError
    from lapse.kernel.kinds.errors import KindError
    from lapse.kernel.settings import UnknownSetting
    from lapse.kernel.topology import TopicsFileError
    from lapse.shell.startup_checks import StartupRefused

    if isinstance(exc, (UnknownSetting, ConfigFileError, KindsFileError, KindError, TopicsFileError,
                        StartupRefused, ConnectionRefused)):
        return ExitCode.CONFIG, "", str(exc)  # their messages name the setting or file themselves
    if isinstance(exc, ValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in first["loc"]) or exc.title
        return ExitCode.CONFIG, "", f"invalid value for {where}: {first['msg']}"
    return None


def _registry(exc: BaseException, _settings: Settings | None) -> tuple[ExitCode, str, str] | None:
    from lapse.kernel.codec import DecodeError  # function-local: keeps `lapse --help` fast
    from lapse.kernel.schema_registry import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError):  # its message names the registry already
        if exc.status in (401, 403):
            return ExitCode.CONFIG, "", str(exc)
        return (ExitCode.UNREACHABLE if exc.transient else ExitCode.INTERNAL), "", str(exc)
    if isinstance(exc, DecodeError) and getattr(exc, "transient", False):
        return ExitCode.UNREACHABLE, "schema registry", str(exc)
    return None


def _system(exc: BaseException, _settings: Settings | None) -> tuple[ExitCode, str, str] | None:
    """Interrupts, timeouts and what the operating system refused (files, connections)."""
    if isinstance(exc, (KeyboardInterrupt, click.Abort)):
        return ExitCode.INTERRUPTED, "interrupted", "stopped before it finished"
    if isinstance(exc, TimeoutError):
        return ExitCode.INTERRUPTED, "timed out", _first_line(exc)
    if isinstance(exc, (socket.gaierror, socket.herror)):  # a host name that does not resolve
        return ExitCode.UNREACHABLE, "unreachable", _first_line(exc)
    if isinstance(exc, ConnectionError):
        return ExitCode.UNREACHABLE, "unreachable", exc.strerror or _first_line(exc)
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                        FileExistsError)):
        return ExitCode.CONFIG, str(exc.filename or "file"), exc.strerror or _first_line(exc)
    return None


_CLASSIFIERS: tuple[Callable[[BaseException, Settings | None], tuple[ExitCode, str, str] | None], ...] = (
    _system, _configuration, _kafka, _database, _registry)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it was raised from or while handling, a few steps down."""
    seen: BaseException | None = exc
    for _ in range(CAUSES_FOLLOWED):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _known(exc: BaseException, settings: Settings | None) -> tuple[ExitCode, str, str] | None:
    for classify in _CLASSIFIERS:
        try:
            found = classify(exc, settings)
        except ImportError:  # an optional driver is not installed: not its error, then
            found = None
        if found is not None:
            return found
    return None


def _classify(exc: BaseException, settings: Settings | None) -> tuple[ExitCode, str, str] | None:
    """(code, what, why) for an error the boundary knows, following causes a few steps; None else.
    An unreachable dependency anywhere in the chain decides: a kinds file that "cannot read table"
    because the database is down is an outage, not a wrong kinds file."""
    found = [known for link in _chain(exc) if (known := _known(link, settings)) is not None]
    outages = [known for known in found if known[0] == ExitCode.UNREACHABLE]
    return (outages or found)[0] if found else None


def _secrets(settings: Settings | None) -> list[str]:
    """The secret values of `settings`, masked wherever they appear in a message."""
    if settings is None:
        return []
    from urllib.parse import unquote, urlsplit

    values = settings.kafka.secret_values()  # SASL and SSL passwords, secret-named `kafka.extra` values
    if settings.schemas.registry_auth is not None:
        values.append(settings.schemas.registry_auth.get_secret_value())
    try:
        password = urlsplit(settings.database.url_plain()).password
    except ValueError:
        password = None
    if password:
        values += [password, unquote(password)]
    if settings.schemas.registry_auth is not None:
        values.append(settings.schemas.registry_auth.get_secret_value().partition(":")[2])
    # The other connections' secrets (lapse.kernel.connections maps them to their clients).
    for secret in (settings.schemas.registry_bearer_token, settings.schemas.registry_key_password,
                   settings.database.ssl_key_password, settings.report.smtp_password):
        if secret is not None and secret.get_secret_value():
            values.append(secret.get_secret_value())
    return values


def diagnose(exc: BaseException, settings: Settings | None = None) -> Diagnosis:
    """The one line and exit code for `exc` (see ExitCode)."""
    secrets = _secrets(settings)
    if isinstance(exc, CommandFailed):
        return Diagnosis(ExitCode(exc.exit_code), "lapse: " + masked_line(exc.format_message(), secrets))
    if isinstance(exc, click.ClickException):
        behind = exc.__context__
        known = _classify(behind, settings) if behind is not None else None
        if known is not None and known[0] == ExitCode.UNREACHABLE:  # the outage's own line
            return Diagnosis(known[0], "lapse: " + masked_line(_text(known), secrets))
        if known is not None and known[0] != ExitCode.INTERNAL:
            return Diagnosis(known[0], "lapse: " + masked_line(exc.format_message(), secrets))
        if isinstance(exc, click.UsageError):
            return Diagnosis(ExitCode.USAGE, "lapse: " + masked_line(_usage_text(exc), secrets))
        return Diagnosis(_code(exc.exit_code), "lapse: " + masked_line(exc.format_message(), secrets))
    known = _classify(exc, settings)
    if known is not None:
        return Diagnosis(known[0], "lapse: " + masked_line(_text(known), secrets))
    text = f"internal error: {type(exc).__name__}: {_first_line(exc)}"
    return Diagnosis(ExitCode.INTERNAL, "lapse: " + masked_line(text, secrets)[: MAX_LINE_CHARS - 45]
                     + " (run with --debug for the traceback)")


def _text(known: tuple[ExitCode, str, str]) -> str:
    """`<what>: <why>`, or `<why>` alone when the message names its subject itself."""
    _, what, why = known
    return f"{what}: {why}" if what else why


def _code(value: int) -> ExitCode:
    try:
        return ExitCode(value)
    except ValueError:
        return ExitCode.PROBLEM_FOUND


def _usage_text(exc: click.UsageError) -> str:
    """`<command>: <message> (try 'lapse <command> --help')`: click's usage error in one line."""
    path = exc.ctx.command_path if exc.ctx is not None else "lapse"
    command = path.partition(" ")[2]
    hint = f" (try '{path} --help')" if exc.ctx is not None else ""
    return f"{command}: {exc.format_message()}{hint}" if command else f"{exc.format_message()}{hint}"


# --- the boundary -----------------------------------------------------------------------------

def run_bounded(invoke: Callable[[], Any]) -> int:
    """Run `invoke` (the click group's non-standalone main) and return the process exit status,
    printing one line on stderr for whatever escaped it. It runs in a copy of the current context,
    so what a command sets for itself (its settings here, its Kafka log policy) ends with it."""
    return contextvars.copy_context().run(_run_bounded, invoke)


def _run_bounded(invoke: Callable[[], Any]) -> int:
    invocation = _Invocation()
    _CURRENT.set(invocation)  # in the copied context: it ends with this run
    try:
        result = invoke()
    except SystemExit as exc:  # a command's own exit status (`sys.exit(1)` after a report)
        if isinstance(exc.code, int) or exc.code is None:
            return exc.code or 0
        _say("lapse: " + masked_line(str(exc.code), _secrets(invocation.settings)))
        return int(ExitCode.PROBLEM_FOUND)
    except (Exception, KeyboardInterrupt) as exc:  # the boundary: everything ends as one line
        settings = invocation.settings
        diagnosis = diagnose(exc, settings)
        debug = invocation.debug or (settings is not None and settings.runtime.log_level.upper() == "DEBUG")
        _flush(sys.stdout)
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        _say(diagnosis.line)
        return int(diagnosis.code)
    return result if isinstance(result, int) else 0


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    _flush(sys.stderr)


def _flush(stream: Any) -> None:
    try:
        stream.flush()
    except (OSError, ValueError):  # a closed pipe: nothing more to say on it
        pass


class BoundedGroup(click.Group):
    """The root `lapse` group: run standalone (the console script, CliRunner), it passes through
    the error boundary and exits with its code."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        status = run_bounded(lambda: super(BoundedGroup, self).main(
            args, prog_name or "lapse", complete_var, standalone_mode=False, **extra))
        sys.exit(status)


__all__ = [
    "BoundedGroup",
    "CommandFailed",
    "Diagnosis",
    "ExitCode",
    "debug_requested",
    "diagnose",
    "masked_line",
    "note_debug",
    "note_settings",
    "run_bounded",
]
