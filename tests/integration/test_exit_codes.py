"""`lapse` as an operator runs it, a subprocess each: a broker or database with nothing listening,
a wrong setting, a broken config file and a wrong window each end in one line on stderr and the
exit code of the table in docs/troubleshooting.md, within a bounded time; an audit that could check nothing never
says "invariants hold"."""

from __future__ import annotations

import json
import socket

import pytest

from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.kernel.settings import env_var
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.processes import Finished, run_lapse
from tests.fixtures.readers import READER_TOPICS

# Each command must end well within this (the readers wait 10 s for metadata, the worker 10 s).
BOUND_S = 45.0
SECRET = "s3cret-Pw"


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
