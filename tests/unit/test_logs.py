"""Log lines as a person and a machine read them: on a terminal, text with the time, level, role,
message and the identifiers; anywhere else one JSON object per line; an error's traceback cut to
its last line unless tracebacks are asked for (`lapse --debug`, the DEBUG level)."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from lapse.kernel.logs import configure_logging, formatter, get_logger, set_role
from lapse.kernel.settings import Settings, load_settings


@pytest.fixture
def terminal() -> Iterator[tuple[io.TextIOWrapper, int]]:
    """A real terminal (a pseudo-terminal's follower end to write to, its leader's fd to read)."""
    leader, follower = pty.openpty()
    stream = open(follower, "w", encoding="utf-8", closefd=True)  # noqa: SIM115 - closed below
    try:
        yield stream, leader
    finally:
        stream.close()
        os.close(leader)


@pytest.fixture(autouse=True)
def _no_role() -> Iterator[None]:
    yield
    set_role("")


def _settings(**runtime: object) -> Settings:
    return load_settings(runtime=runtime)


def _record(message: str = "batch committed", exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    record = get_logger("processors").makeRecord(
        "lapse.processors", logging.WARNING, __file__, 1, message, (), None, extra=extra)
    if exc is not None:
        try:
            raise exc
        except BaseException as raised:
            record.exc_info = (type(raised), raised, raised.__traceback__)
    return record


def _failing() -> ValueError:
    def inner() -> None:
        raise ValueError("the last line")

    try:
        inner()
    except ValueError as exc:
        return exc
    raise AssertionError


def test_on_a_terminal_a_line_says_time_level_role_message_and_identifiers(terminal) -> None:
    stream, _ = terminal
    set_role("process-0")
    colored = formatter(_settings(), stream).format(_record(op_key="expire-order:1", correlation_id="req-42"))
    line = re.sub(r"\x1b\[[0-9;]*m", "", colored)
    assert line != colored  # a terminal gets colors
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[warning *\] process-0 +batch committed "
                    r"\[lapse.processors\] op_key=expire-order:1 correlation_id=req-42$", line), line


def test_anywhere_else_a_line_is_one_json_object() -> None:
    set_role("sweep")
    line = formatter(_settings(), io.StringIO()).format(_record(op_key="expire-order:1"))
    data = json.loads(line)
    assert data["msg"] == "batch committed" and data["level"] == "warning" and data["logger"] == "lapse.processors"
    assert data["role"] == "sweep" and data["op_key"] == "expire-order:1"
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$", data["ts"]), data["ts"]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_format_setting_wins_over_the_stream(log_format: str, terminal) -> None:
    stream, _ = terminal
    for target in (stream, io.StringIO()):
        line = formatter(_settings(log_format=log_format), target).format(_record())
        assert line.startswith("{") == (log_format == "json"), line


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_error_shows_its_last_line_and_its_whole_traceback_only_when_asked(log_format: str) -> None:
    short = formatter(_settings(log_format=log_format), io.StringIO()).format(_record("pass failed", _failing()))
    full = formatter(_settings(log_format=log_format, log_tracebacks=True), io.StringIO()).format(
        _record("pass failed", _failing()))
    debug = formatter(_settings(log_format=log_format, log_level="DEBUG"), io.StringIO()).format(
        _record("pass failed", _failing()))
    assert "ValueError: the last line" in short and "Traceback" not in short and "inner" not in short
    for shown in (full, debug):
        assert "Traceback (most recent call last)" in shown and "in inner" in shown
    if log_format == "json":
        assert json.loads(short)["error"] == "ValueError: the last line"
        assert "in inner" in json.loads(full)["traceback"]


def test_a_log_file_gets_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "lapse.log"
    configure_logging(_settings(log_file=path))
    set_role("relay")
    get_logger("relay").info("relayed", extra={"rows": 3})
    configure_logging(_settings())  # closes the file
    (line,) = path.read_text().splitlines()
    assert json.loads(line) | {"ts": None} == {"ts": None, "level": "info", "logger": "lapse.relay", "role": "relay",
                                               "rows": 3, "msg": "relayed"}
