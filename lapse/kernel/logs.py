"""Structured logging: one JSON object per line with the op key and correlation id as fields.

Callers pass identifiers through `extra=` (`op_key`, `correlation_id`, `partition`, …); payload
bodies and personal data are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from lapse.kernel.settings import Settings

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        return f"{record.levelname[0]} {record.name}: {record.getMessage()} {fields}".rstrip()


def configure_logging(settings: Settings) -> None:
    """Send Lapse's logs to stderr in the configured format (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.runtime.log_format == "json" else TextFormatter())
    root = logging.getLogger("lapse")
    root.handlers[:] = [handler]
    root.setLevel(settings.runtime.log_level.upper())
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"lapse.{name}")
