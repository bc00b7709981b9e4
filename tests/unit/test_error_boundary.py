"""The error boundary of `lapse`: every class of error that escapes a command is one line on stderr
with its documented exit code, no traceback and no secret; --debug adds the traceback. The errors
are real ones: a Kafka client and a database engine pointed at a port where nothing listens, a
broken config file, a wrong setting."""

from __future__ import annotations

import logging
import os
import socket
import string
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from lapse.kernel.config_file import ConfigFileError
from lapse.kernel.kafka_logs import CONNECTION_LOGGER, LOGGER, KafkaLogSink, _shape
from lapse.kernel.kinds import KindsFileError
from lapse.kernel.schema_registry import SchemaRegistryClient
from lapse.kernel.settings import check_environment, load_settings
from lapse.kernel.topology import load_topology
from lapse.shell.app import main
from lapse.shell.error_boundary import MAX_LINE_CHARS, CommandFailed, ExitCode, diagnose, note_debug, run_bounded

SECRET = "Sup3rS3cret"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LAPSE_* variable of the caller's shell, and an empty working folder (no ./lapse.toml)."""
    for var in list(os.environ):
        if var.startswith("LAPSE_") and not var.startswith("LAPSE_TEST_"):
            monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)


def closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def caught(action: Callable[[], object]) -> BaseException:
    try:
        action()
    except BaseException as exc:  # the test wants whatever it raises
        return exc
    raise AssertionError("expected an exception")


def bounded(exc: BaseException, capsys: pytest.CaptureFixture[str], *, debug: bool = False) -> tuple[int, str]:
    """Run a command body that raises `exc` through the boundary: (exit code, stderr)."""
    def body() -> None:
        if debug:
            note_debug()
        raise exc

    code = run_bounded(body)
    return code, capsys.readouterr().err


def assert_one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and SECRET not in err
    assert err.startswith("lapse: ")
    return err.rstrip("\n")


# --- each class of error ------------------------------------------------------------------------

def _kafka_unreachable() -> BaseException:
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{closed_port()}", "group.id": "g",
                         "logger": KafkaLogSink()})
    try:
        return caught(lambda: consumer.list_topics(timeout=0.5))
    finally:
        consumer.close()


def _database_unreachable() -> BaseException:
    engine = create_engine(f"postgresql+psycopg://lapse:{SECRET}@127.0.0.1:{closed_port()}/lapse")
    try:
        return caught(engine.connect)
    finally:
        engine.dispose()


def _sqlite_without_tables(tmp: Path) -> BaseException:
    engine = create_engine(f"sqlite:///{tmp / 'x.db'}")
    try:
        with engine.connect() as conn:
            return caught(lambda: conn.execute(text("SELECT * FROM lapse_ledger WHERE op_key = :k"),
                                               {"k": SECRET}))
    finally:
        engine.dispose()


def _registry_unreachable() -> BaseException:
    client = SchemaRegistryClient(f"http://127.0.0.1:{closed_port()}", auth=f"lapse:{SECRET}", timeout_s=1)
    return caught(lambda: client.schema_by_id(1))


def _bad_topics_file(tmp: Path) -> BaseException:
    bad = tmp / "topics.yaml"
    bad.write_text("topics: [1, 2]\n")
    return caught(lambda: load_topology(bad))


def _invalid_setting() -> BaseException:
    return caught(lambda: load_settings(processor={"batch_size": 0}))


CASES: dict[str, tuple[Callable[[Path], BaseException], ExitCode, str]] = {
    "kafka unreachable": (lambda _: _kafka_unreachable(), ExitCode.UNREACHABLE, "lapse: kafka"),
    "kafka authentication": (lambda _: KafkaException(KafkaError(KafkaError._AUTHENTICATION, "SASL failed")),
                             ExitCode.CONFIG, "lapse: kafka: SASL failed"),
    "database unreachable": (lambda _: _database_unreachable(), ExitCode.UNREACHABLE, "lapse: database unreachable"),
    "database without tables": (_sqlite_without_tables, ExitCode.CONFIG, "lapse: database: no such table"),
    "registry unreachable": (lambda _: _registry_unreachable(), ExitCode.UNREACHABLE, "lapse: schema registry http"),
    "invalid setting": (lambda _: _invalid_setting(), ExitCode.CONFIG, "lapse: invalid value for processor"),
    "unknown setting": (lambda _: caught(lambda: check_environment({"LAPSE_KAFKA__BOOTSTRAP": "x"})),
                        ExitCode.CONFIG, "lapse: unknown setting LAPSE_KAFKA__BOOTSTRAP"),
    "config file": (lambda _: ConfigFileError("site.toml: not valid TOML"), ExitCode.CONFIG, "lapse: site.toml"),
    "kinds file": (lambda _: KindsFileError("kinds.yaml: kind 'x': table: no table 'y'"), ExitCode.CONFIG,
                   "lapse: kinds.yaml: kind 'x'"),
    "topics file": (_bad_topics_file, ExitCode.CONFIG, "lapse: "),
    "missing file": (lambda tmp: caught(lambda: (tmp / "nowhere.pem").read_bytes()), ExitCode.CONFIG,
                     "lapse: "),
    "permission": (lambda _: PermissionError(13, "Permission denied", "/etc/lapse/key.pem"), ExitCode.CONFIG,
                   "lapse: /etc/lapse/key.pem: Permission denied"),
    "timeout": (lambda _: TimeoutError("no records for 60s"), ExitCode.INTERRUPTED, "lapse: timed out"),
    "interrupt": (lambda _: KeyboardInterrupt(), ExitCode.INTERRUPTED, "lapse: interrupted"),
    "refusal": (lambda _: CommandFailed(ExitCode.USAGE, "group g is active"), ExitCode.USAGE,
                "lapse: group g is active"),
    "internal": (lambda _: RuntimeError(f"boom at postgresql://u:{SECRET}@h/db"), ExitCode.INTERNAL,
                 "lapse: internal error: RuntimeError: boom"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_class_of_error_is_one_line_with_its_code(case: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    make, expected_code, start = CASES[case]
    code, err = bounded(make(tmp_path), capsys)
    line = assert_one_line(err)
    assert code == expected_code, line
    assert line.startswith(start), line
    if expected_code == ExitCode.INTERNAL:
        assert line.endswith("(run with --debug for the traceback)")


def test_a_wrapper_keeps_its_message_and_takes_the_code_of_what_it_replaced(capsys) -> None:
    def wrapped(error: BaseException) -> Callable[[], None]:
        def raise_it() -> None:
            try:
                raise error
            except Exception:
                raise click.ClickException("the kinds file is wrong") from None
        return raise_it

    code, err = bounded(caught(wrapped(KindsFileError("kinds.yaml: kind 'x': bad"))), capsys)
    assert (code, assert_one_line(err)) == (ExitCode.CONFIG, "lapse: the kinds file is wrong")


def test_an_outage_anywhere_below_decides_the_code_and_the_line(capsys) -> None:
    def kinds_check() -> None:  # what a kinds file check does when the database is down
        try:
            raise _database_unreachable()
        except Exception:
            try:
                raise KindsFileError("kinds.yaml: kind 'x': table: cannot read table 'y'") from None
            except KindsFileError:
                raise click.ClickException("kinds.yaml: kind 'x': table: cannot read table 'y'") from None

    code, err = bounded(caught(kinds_check), capsys)
    assert code == ExitCode.UNREACHABLE
    assert assert_one_line(err).startswith("lapse: database unreachable: connection failed: ")


def test_debug_prints_the_traceback_above_the_line(capsys) -> None:
    code, err = bounded(RuntimeError("boom"), capsys, debug=True)
    assert code == ExitCode.INTERNAL
    assert err.startswith("Traceback") and err.splitlines()[-1].startswith("lapse: internal error: RuntimeError")


def test_a_commands_own_exit_status_passes_through(capsys) -> None:
    assert bounded(SystemExit(1), capsys) == (1, "")


def test_secrets_of_the_settings_are_masked_wherever_they_show() -> None:
    settings = load_settings(kafka={"sasl_password": SECRET}, database={"url": f"postgresql://u:{SECRET}@h/db"})
    line = diagnose(RuntimeError(f"sasl said no to {SECRET} (plain)"), settings).line
    assert SECRET not in line and "********" in line


# --- through the command line --------------------------------------------------------------------

@pytest.mark.parametrize(("args", "env", "code", "start"), [
    (["audit", "--from-beginning", "--since", "x"], {}, ExitCode.USAGE, "lapse: audit: Invalid value for '--since'"),
    (["audit", "--since", "2026-11-30T10:00", "--until", "2026-11-30T09:00"], {}, ExitCode.USAGE,
     "lapse: audit: --since 2026-11-30T10:00:00+00:00 is not before --until"),
    (["no-such-command"], {}, ExitCode.USAGE, "lapse: No such command"),
    (["status"], {"LAPSE_PROCESSOR__BATCH_SIZE": "0"}, ExitCode.CONFIG, "lapse: invalid setting processor.batch_size"),
    (["status"], {"LAPSE_PROCESOR__BATCH_SIZE": "10"}, ExitCode.CONFIG, "lapse: unknown setting LAPSE_PROCESOR"),
    (["--config", "nowhere.toml", "status"], {}, ExitCode.CONFIG, "lapse: config file nowhere.toml does not exist"),
    (["status"], {"LAPSE_DATABASE__URL": f"postgresql+psycopg://lapse:{SECRET}@127.0.0.1:{closed_port()}/x"},
     ExitCode.UNREACHABLE, "lapse: database postgresql+psycopg://lapse:********@127.0.0.1"),
    (["status", "--database-url", f"postgresql+psycopg://lapse:{SECRET}@127.0.0.1:{closed_port()}/x"], {},
     ExitCode.USAGE, "lapse: status: Invalid value for '--database-url': holds a password, which every user"),
])
def test_the_command_line_ends_in_one_line_and_its_code(args, env, code, start) -> None:
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    assert assert_one_line(result.stderr).startswith(start)


# --- odd messages ---------------------------------------------------------------------------------

URL_SAFE = string.ascii_letters + string.digits + "!$&'()*+,;=-._~%:@/?#[]"
ODD_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=3000)


@given(before=ODD_TEXT, after=ODD_TEXT, password=st.text(URL_SAFE, min_size=1, max_size=40),
       scheme=st.sampled_from(["postgresql+psycopg", "https", "sasl_ssl", "s3"]))
def test_any_message_is_one_bounded_line_with_the_password_masked(before: str, after: str, password: str,
                                                                  scheme: str) -> None:
    secret = "Pw" + password
    message = f"{before} {scheme}://lapse:{secret}@db.internal:5432/lapse {after}"
    for exc in (RuntimeError(message), CommandFailed(ExitCode.CONFIG, message), TimeoutError(message)):
        line = diagnose(exc).line
        assert "\n" not in line and "\r" not in line and not any(ch in line for ch in "\x00\x1b\u2028\u2029")
        assert len(line) <= MAX_LINE_CHARS + len("lapse: ") + len(" (run with --debug for the traceback)")
        assert secret not in line


@given(value=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=200))
def test_a_password_assignment_in_free_text_is_masked(value: str) -> None:
    token = "Zq" + value.split()[0] if value.split() else "Zq9"
    line = diagnose(RuntimeError(f"dsn host=db password={token} sslmode=require")).line
    assert token not in line


# --- librdkafka's log lines -------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_librdkafka_lines_are_rate_limited_per_line_with_a_count(caplog) -> None:
    clock = Clock()
    sink = KafkaLogSink(window_s=30, clock=clock)
    caplog.set_level(logging.DEBUG, logger="lapse")
    refused = ("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
               "(after {}ms in state CONNECT)")
    for attempt in range(100):
        clock.now = attempt * 0.1
        sink.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", refused.format(attempt % 7))
    sink.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#consumer-1", "configuration property ignored")
    sink.log(logging.INFO, "%s [%s] %s", "CGRPOP", "rdkafka#consumer-1", "joining group")
    clock.now = 31.0
    sink.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", refused.format(0))

    shown = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert shown == [
        (CONNECTION_LOGGER, logging.ERROR, refused.format(0)),
        (LOGGER, logging.WARNING, "configuration property ignored"),
        (CONNECTION_LOGGER, logging.ERROR, refused.format(0) + " (99 more like it in the last 30s)"),
    ]
    assert caplog.records[0].facility == "FAIL" and caplog.records[0].client == "rdkafka#consumer-1"


def test_a_real_clients_log_lines_reach_python_logging_rate_limited(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="lapse")
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{closed_port()}", "group.id": "g",
                         "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 10, "logger": KafkaLogSink()})
    try:
        consumer.poll(1.5)
    finally:
        consumer.close()
    failures = [r for r in caplog.records if r.name == CONNECTION_LOGGER]
    assert len(failures) == 1 and "Connection refused" in failures[0].getMessage()


def test_librdkafkas_own_suppression_count_does_not_make_a_line_new() -> None:
    """librdkafka appends ", N identical error(s) suppressed" to a repeated line; that is still the
    same line, held back within the window."""
    sink = KafkaLogSink(window_s=30, clock=lambda: 0.0)
    line = "127.0.0.1:1/bootstrap: Connect to 127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT{})"
    assert sink._admit(("FAIL", _shape(line.format("")))) == 0
    assert sink._admit(("FAIL", _shape(line.format(", 1 identical error(s) suppressed")))) is None
