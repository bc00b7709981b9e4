"""Structured logging, rendered by structlog's formatter for the standard library's records: text on
a terminal (time, level, role, message, then the identifiers as `key=value`), one JSON object per
line otherwise (`runtime.log_format`).

Callers pass identifiers through `extra=` (`op_key`, `correlation_id`, `partition`, …); payload
bodies and personal data are never logged. An error's traceback is cut to its last line unless
`runtime.log_tracebacks` (`lapse --debug`) or the DEBUG level asks for all of it.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import TYPE_CHECKING, Any, TextIO

from lapse.kernel.settings import Settings

if TYPE_CHECKING:
    from structlog.dev import ConsoleRenderer
    from structlog.typing import EventDict, ExcInfo, WrappedLogger

ROOT = "lapse"
_ROLE = {"name": ""}  # what this process is: its role (`process-0`) or its command (`status`)


def set_role(name: str) -> None:
    """Name this process's part in every log line from now on: its role or its command."""
    _ROLE["name"] = name


def _add_role(_logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
    if _ROLE["name"]:
        event.setdefault("role", _ROLE["name"])
    return event


def _last_line(exc_info: ExcInfo) -> str:
    return "".join(traceback.format_exception_only(exc_info[1])).strip().splitlines()[-1]


def _exception_fields(full: bool) -> Any:
    """A processor turning `exc_info` into `error` (its last line) and, when `full`, `traceback`."""
    def fields(_logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
        exc_info = event.pop("exc_info", None)
        if isinstance(exc_info, tuple) and exc_info[1] is not None:
            event["error"] = _last_line(exc_info)
            if full:
                event["traceback"] = "".join(traceback.format_exception(*exc_info))
        return event

    return fields


def _text_renderer(colors: bool, full: bool) -> ConsoleRenderer:
    """Time, level, role and message in columns, then the other fields as key=value, in the order
    the call gave them."""
    # function-local: structlog's console renderer takes a tenth of a second to import; `lapse --help` must not
    from structlog.dev import Column, ConsoleRenderer, KeyValueColumnFormatter, LogLevelColumnFormatter

    styles = ConsoleRenderer.get_default_column_styles(colors)

    def exception(sio: TextIO, exc_info: ExcInfo) -> None:
        sio.write("\n" + ("".join(traceback.format_exception(*exc_info)).rstrip() if full
                          else _last_line(exc_info)))

    return ConsoleRenderer(exception_formatter=exception, sort_keys=False, columns=[  # colors: the columns' styles
        Column("timestamp", KeyValueColumnFormatter(None, styles.timestamp, styles.reset, value_repr=str)),
        Column("level", LogLevelColumnFormatter(ConsoleRenderer.get_default_level_styles(colors), styles.reset,
                                                width=7)),
        Column("role", KeyValueColumnFormatter(None, styles.logger_name, styles.reset, value_repr=str, width=10)),
        Column("event", KeyValueColumnFormatter(None, styles.bright, styles.reset, value_repr=str)),
        Column("logger", KeyValueColumnFormatter(None, styles.logger_name, styles.reset, value_repr=str,
                                                 prefix="[", postfix="]")),
        Column("", KeyValueColumnFormatter(styles.kv_key, styles.kv_value, styles.reset, value_repr=str)),
    ])


def formatter(settings: Settings, stream: TextIO) -> logging.Formatter:
    """The formatter of Lapse's log lines on `stream`: text where the format says so, or `auto` and
    `stream` is a terminal; JSON (`ts`, `level`, `logger`, `msg`, the extra fields) otherwise."""
    # function-local: structlog takes a tenth of a second to import; `lapse --help` must not
    import structlog
    from structlog.stdlib import ExtraAdder, ProcessorFormatter

    runtime = settings.runtime
    terminal = stream.isatty()
    text = runtime.log_format == "text" or (runtime.log_format == "auto" and terminal)
    full = runtime.log_tracebacks or runtime.log_level.upper() == "DEBUG"
    stamp = "%Y-%m-%d %H:%M:%S" if text else "iso"
    pre_chain: list[Any] = [structlog.processors.TimeStamper(fmt=stamp, utc=True, key="timestamp" if text else "ts"),
                            structlog.stdlib.add_log_level, structlog.stdlib.add_logger_name, _add_role,
                            ExtraAdder()]
    if text:
        final: list[Any] = [_text_renderer(colors=terminal, full=full)]
    else:
        final = [_exception_fields(full), structlog.processors.EventRenamer("msg"),
                 structlog.processors.JSONRenderer(default=str)]
    return ProcessorFormatter(foreign_pre_chain=pre_chain,
                              processors=[ProcessorFormatter.remove_processors_meta, *final])


def configure_logging(settings: Settings) -> None:
    """Send Lapse's logs to stderr, or to `runtime.log_file`, in the configured format (idempotent)."""
    runtime = settings.runtime
    if runtime.log_file is not None:
        runtime.log_file.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(runtime.log_file, encoding="utf-8")
        stream: TextIO = handler.stream  # type: ignore[attr-defined]
    else:
        handler = stream_handler = logging.StreamHandler(sys.stderr)
        stream = stream_handler.stream
    handler.setFormatter(formatter(settings, stream))
    root = logging.getLogger(ROOT)
    for old in root.handlers:
        if isinstance(old, logging.FileHandler):
            old.close()
    root.handlers[:] = [handler]
    root.setLevel(runtime.log_level.upper())
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{name}")
