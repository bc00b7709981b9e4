"""`lapse` as an operator runs it, a subprocess each: a broker or database with nothing listening,
a wrong setting, a broken config file and a wrong window each end in one line on stderr and the
exit code of the table in docs/troubleshooting.md, within a bounded time; an audit that could check nothing never
says "invariants hold"."""

from __future__ import annotations

import json
import os
import socket

import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.kernel.settings import env_var
from lapse.shell.app import main
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.processes import Finished, run_lapse
from tests.fixtures.readers import READER_TOPICS
from tests.fixtures.topology import TOPICS_FILE

# Each command must end well within this (the readers wait 10 s for metadata, the worker 10 s).
BOUND_S = 45.0
SECRET = "s3cret-Pw"
# No LAPSE_* variable of the caller's: each case says all it sets.
CLEAN_ENV = {name: None for name in os.environ if name.startswith("LAPSE_") and not name.startswith("LAPSE_TEST_")}


def closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_one_line(done: Finished, code: ExitCode, start: str) -> None:
    what = f"lapse {' '.join(done.args)}"
    assert (done.code, len(done.stderr)) == (code, 1), f"{what}: exit {done.code}, stderr {done.stderr}"
    assert done.stderr[0].startswith(start), f"{what}: {done.stderr[0]}"
    assert SECRET not in done.stderr[0]


@pytest.mark.slow
def test_a_broker_with_nothing_listening_is_one_line_and_exit_4(pg_url, tmp_path):
    bootstrap = f"127.0.0.1:{closed_port()}"
    env = {env_var("kafka.bootstrap_servers"): bootstrap, env_var("database.url"): pg_url,
           env_var("kinds.file"): str(packaged_kinds_file())}
    for done in run_lapse(["status"], ["topics", "apply", "--dry-run"], ["process", "--exit-when-idle", "1"],
                          ["audit", "--from-beginning"], env=env, cwd=tmp_path, bound_s=BOUND_S):
        assert_one_line(done, ExitCode.UNREACHABLE, f"lapse: kafka at {bootstrap} unreachable: ")
        assert done.stdout == ""


def test_a_database_with_nothing_listening_is_one_line_and_exit_4(tmp_path):
    port = closed_port()
    env = {env_var("database.url"): f"postgresql+psycopg://lapse:{SECRET}@127.0.0.1:{port}/lapse",
           env_var("kafka.bootstrap_servers"): f"127.0.0.1:{closed_port()}",
           env_var("kinds.file"): str(packaged_kinds_file())}
    for done in run_lapse(["status"], ["dlq", "list"], ["process", "--exit-when-idle", "1"], ["db", "current"],
                          env=env, cwd=tmp_path, bound_s=BOUND_S):
        assert_one_line(done, ExitCode.UNREACHABLE, "")
        assert f"postgresql+psycopg://lapse:********@127.0.0.1:{port}/lapse" in done.stderr[0]
        assert "Connection refused" in done.stderr[0]


def test_wrong_configuration_is_one_line_and_exit_3(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[kafka]\nbootstrap_servers = \n")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[processor]\nbatch_sise = 10\n")
    cases = [
        (["status"], {env_var("processor.batch_size"): "0"},
         "lapse: invalid setting processor.batch_size from env LAPSE_PROCESSOR__BATCH_SIZE: "),
        (["audit", "--from-beginning"], {"LAPSE_PROCESOR__BATCH_SIZE": "10"},
         "lapse: unknown setting LAPSE_PROCESOR__BATCH_SIZE; did you mean LAPSE_PROCESSOR__BATCH_SIZE?"),
        (["--config", str(broken), "process"], {}, f"lapse: {broken}: not valid TOML: "),
        (["--config", str(unknown), "status"], {},
         f"lapse: {unknown}: unknown setting processor.batch_sise; did you mean processor.batch_size?"),
        (["db", "current"], {}, "lapse: no database configured: "),
    ]
    for (args, env, start) in cases:
        (done,) = run_lapse(args, env=env, cwd=tmp_path, bound_s=BOUND_S)
        assert_one_line(done, ExitCode.CONFIG, start)


def test_an_audit_window_that_ends_before_it_starts_is_a_usage_error(tmp_path):
    (done,) = run_lapse(["audit", "--since", "2026-11-30T12:00:00Z", "--until", "2026-11-30T11:00:00Z"],
                        env={}, cwd=tmp_path, bound_s=BOUND_S)
    assert_one_line(done, ExitCode.USAGE, "lapse: audit: --since 2026-11-30T12:00:00+00:00 is not before --until ")
    assert done.stdout == ""


def test_an_audit_of_empty_topics_checks_nothing_and_says_so(kafka_bootstrap, pg_url, unique, tmp_path):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    env = {**connection_env(settings), env_var("runtime.log_level"): "WARNING"}
    text, as_json = run_lapse(["audit", "--from-beginning"], ["audit", "--from-beginning", "--json"],
                              env=env, cwd=tmp_path, bound_s=BOUND_S)
    assert (text.code, text.stderr) == (ExitCode.OK, [])
    assert text.stdout.splitlines()[-1] == "nothing to audit: no records in the window"
    assert "invariants hold" not in text.stdout
    report = json.loads(as_json.stdout)
    assert (report["verdict"], report["broken"], report["incomplete"]) == ("nothing to audit", [], [])
    assert sum(report["in_range"].values()) == sum(report["scanned"].values()) == 0


def test_an_audit_of_topics_that_do_not_exist_is_one_line_and_exit_3(kafka_bootstrap, unique, tmp_path):
    env = {env_var("kafka.bootstrap_servers"): kafka_bootstrap, env_var("topics.prefix"): unique("absent") + "."}
    (done,) = run_lapse(["audit", "--from-beginning"], env=env, cwd=tmp_path, bound_s=BOUND_S)
    assert_one_line(done, ExitCode.CONFIG, "lapse: audit: topic ")
    assert "does not exist" in done.stderr[0] and done.stdout == ""


def test_each_wrong_input_has_its_documented_exit_code_and_one_line(pg_url, tmp_path, monkeypatch):
    """The table of wrong inputs an operator meets, each to the code of docs/troubleshooting.md: the
    database refusing what the configuration says (a wrong password, no such role or database, a
    TLS file that is not one) is a configuration error (3), not an outage (4); libpq refusing the
    URL, a driver that is not installed, a module a Python kind names that fails to import and a
    count Kafka cannot hold are never internal errors (70)."""
    url = make_url(pg_url)
    junk_cert = tmp_path / "not-a-cert.pem"
    junk_cert.write_text("not a certificate\n")
    broken_module = tmp_path / "modules" / "lapse_test_broken_kind.py"
    broken_module.parent.mkdir()
    broken_module.write_text("raise RuntimeError('broken at import')\n")
    kinds = tmp_path / "kinds.yaml"
    kinds.write_text("kinds:\n  broken: {python: 'lapse_test_broken_kind:KIND'}\n")
    topics = tmp_path / "topics.yaml"
    topics.write_text(TOPICS_FILE.read_text().replace("partitions: 12", f"partitions: {2**31}", 1))

    def database(**parts: object) -> dict[str, str]:
        return {env_var("database.url"): url.set(**parts).render_as_string(hide_password=False)}

    db_current = ["db", "current"]
    table = [
        (db_current, database(password=SECRET), ExitCode.CONFIG, "password authentication failed for user"),
        (db_current, database(username="lapse_nobody", password=SECRET), ExitCode.CONFIG,
         'password authentication failed for user "lapse_nobody"'),
        (db_current, database(username="lapse_nobody"), ExitCode.CONFIG, "no password supplied"),
        (db_current, database(database="lapse_nowhere"), ExitCode.CONFIG, 'database "lapse_nowhere" does not exist'),
        (db_current, database(port=99999), ExitCode.CONFIG, 'invalid port number: "99999"'),
        (db_current, database(query={"sslmode": "sometimes"}), ExitCode.CONFIG, 'invalid sslmode value: "sometimes"'),
        (db_current, database(query={"colour": "blue"}), ExitCode.CONFIG, 'invalid connection option "colour"'),
        (db_current, {**database(), env_var("database.sslmode"): "verify-full",
                      env_var("database.ssl_root_cert"): str(junk_cert)},
         ExitCode.CONFIG, "could not read root certificate file"),
        (db_current, database(drivername="postgresql+psycopg2"), ExitCode.CONFIG,
         "write postgresql+psycopg:// instead of postgresql+psycopg2://"),
        (db_current, {env_var("database.url"): "mysql://lapse@127.0.0.1/shop"}, ExitCode.CONFIG,
         "the database URL's driver mysql is not installed"),
        (db_current, {env_var("database.url"): f"sqlite:///{tmp_path}"}, ExitCode.CONFIG,
         "unable to open database file"),
        (["status"], database(password=SECRET), ExitCode.CONFIG, "password authentication failed for user"),
        (["sweep", "--once"], {**database(), env_var("kinds.file"): str(kinds)}, ExitCode.CONFIG,
         "python: cannot load 'lapse_test_broken_kind:KIND': broken at import"),
        (["topics", "apply", "--dry-run", "--file", str(topics)], {}, ExitCode.CONFIG,
         f"partitions: must be a positive integer of at most {2**31 - 1}"),
        (db_current, database(port=closed_port()), ExitCode.UNREACHABLE, "Connection refused"),  # the one outage
    ]
    monkeypatch.syspath_prepend(str(broken_module.parent))
    for args, env, code, expected in table:
        result = CliRunner().invoke(main, args, env={**CLEAN_ENV, **env})
        what = f"lapse {' '.join(args)}"
        assert (result.exit_code, result.stdout) == (code, ""), f"{what}: {result.exit_code} {result.output}"
        (line,) = result.stderr.splitlines()
        assert line.startswith("lapse: ") and expected in line, f"{what}: {line}"
        assert SECRET not in line
