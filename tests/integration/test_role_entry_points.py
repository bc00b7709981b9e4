"""Every long-running role through every entry point, with its dependency away at start (PostgreSQL
and the broker on ports where nothing listens), as real processes: the service form (`lapse run`,
the single-role command, a role process of the supervisor) waits, logging one warning, and exits 0
on SIGTERM; the bounded form (`--once`, `--exit-when-idle`, a one-pass command) exits 4 with the
same one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lapse.devtools.brokers.processes import free_port
from lapse.devtools.demo_kinds import packaged_kinds_file
from lapse.kernel.settings import env_var, load_settings
from lapse.shell.error_boundary import ExitCode
from lapse.shell.roles import ROLES, child_of
from lapse.shell.supervisor import Supervisor
from tests.fixtures.polling import eventually
from tests.fixtures.processes import run_lapse

ALIVE_S = 2.0  # a service still waiting this long after its warning is waiting, not failing
EXIT_BOUND_S = 30.0  # a SIGTERM ends a waiting service long before this
WAITING = "dependency unavailable, retrying with backoff"

# (the role's name in its warning, the command line of its service form)
SERVICES = [("sweep", ["sweep"]), ("process", ["process"]), ("relay", ["relay"]), ("delay", ["delay"]),
            ("reconcile", ["reconcile"]), ("report", ["report", "--serve"]), ("prune", ["prune", "--watch"]),
            ("console", ["console"]), ("run", ["run", "--workers", "1"])]
BOUNDED = [["sweep", "--once"], ["reconcile", "--once"], ["process", "--exit-when-idle", "1"],
           ["relay", "--exit-when-idle", "1"], ["prune"], ["report"],
           ["archive", "--url", "file:///tmp/lapse-archive", "--exit-when-idle", "1"]]


@pytest.fixture
def away(tmp_path) -> dict[str, str]:
    """Settings (dotted path → value) with the database and the broker on ports where nothing listens."""
    return {"database.url": f"postgresql+psycopg://lapse:pw@127.0.0.1:{free_port()}/lapse",
            "kafka.bootstrap_servers": f"127.0.0.1:{free_port()}", "kinds.file": str(packaged_kinds_file()),
            "console.port": str(free_port()), "report.dir": str(tmp_path / "reports"),
            "runtime.log_format": "text"}


def env_of(values: dict[str, str]) -> dict[str, str]:
    return {env_var(path): value for path, value in values.items()}


def warnings_in(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if WAITING in line]


@pytest.mark.parametrize(("role", "args"), SERVICES, ids=[" ".join(args) for _, args in SERVICES])
def test_a_service_waits_for_a_dependency_away_at_start(role, args, away, tmp_path):
    log = tmp_path / "stderr.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAPSE_")}
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lapse", *args], env={**base, **env_of(away)}, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        eventually(lambda: proc.poll() is not None or bool(warnings_in(log)), timeout_s=60,
                   what=f"lapse {' '.join(args)} waiting")
        time.sleep(ALIVE_S)
        assert proc.poll() is None, f"lapse {' '.join(args)} exited {proc.returncode}: {log.read_text()[-2000:]}"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=EXIT_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    warned = warnings_in(log)
    assert code == 0, log.read_text()[-2000:]
    assert len(warned) == 1 and f"{role}: {WAITING}" in warned[0], warned
    assert "Traceback" not in log.read_text()


def test_the_supervisor_runs_every_role_as_a_service_that_waits(away, capfd):
    """Each registered role in its own spawned process, as `lapse run` starts them once its own
    check passed: each warns once and keeps waiting while the dependencies are away, and all end
    on SIGTERM. (The role processes write to the test's captured stderr.)"""
    nested: dict[str, dict[str, str]] = {}
    for path, value in away.items():
        section, name = path.split(".")
        nested.setdefault(section, {})[name] = value
    sup = Supervisor(load_settings(**nested), [child_of(name) for name in ROLES], grace_s=EXIT_BOUND_S)
    said: list[str] = []

    def warned() -> dict[str, int]:
        said.extend(capfd.readouterr().err.splitlines())
        return {name: sum(f"{name}: {WAITING}" in line for line in said) for name in ROLES}

    sup.start()
    try:
        eventually(lambda: all(warned().values()), timeout_s=60, what="every role waiting")
        time.sleep(ALIVE_S)
        assert {name: p.exitcode for name, p in sup.procs.items() if not p.is_alive()} == {}
    finally:
        killed = sup.shutdown()
    assert killed == []
    assert {name: p.exitcode for name, p in sup.procs.items()} == dict.fromkeys(ROLES, 0)
    assert warned() == dict.fromkeys(ROLES, 1)


def test_a_bounded_run_reports_a_dependency_away_at_start_in_the_same_one_line(away, tmp_path):
    done = run_lapse(*BOUNDED, env=env_of(away), cwd=tmp_path)
    port = away["database.url"].rsplit(":", 1)[1].split("/")[0]
    for run in done:
        what = f"lapse {' '.join(run.args)}: exit {run.code}, stderr {run.stderr}"
        assert (run.code, len(run.stderr), run.stdout) == (ExitCode.UNREACHABLE, 1, ""), what
        assert run.stderr[0].startswith(f"lapse: database postgresql+psycopg://lapse:********@127.0.0.1:{port}/lapse "
                                        "unreachable: "), what
    assert len({run.stderr[0] for run in done}) == 1, [run.stderr for run in done]


@pytest.mark.alone  # a bound in seconds from the process's start
def test_with_only_the_broker_away_each_run_names_it(away, sqlite_url, tmp_path):
    """The database answers and no broker does: each bounded run that uses Kafka ends with one line
    naming the broker (exit 4), where it used to idle out with exit 0; `lapse run` names it within
    10 s of its start and waits."""
    broker_away = {**away, "database.url": sqlite_url}
    broker = broker_away["kafka.bootstrap_servers"]
    done = run_lapse(*BOUNDED[:4], env=env_of(broker_away), cwd=tmp_path)
    for run in done:
        assert (run.code, len(run.stderr), run.stdout) == (ExitCode.UNREACHABLE, 1, ""), run
        assert run.stderr[0].startswith(f"lapse: kafka at {broker} unreachable: "), run

    log = tmp_path / "run.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAPSE_")}
    with log.open("w") as err:
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "lapse", "run", "--workers", "1"], cwd=tmp_path,
                                env={**base, **env_of(broker_away)}, stdout=subprocess.DEVNULL, stderr=err)
    try:
        named = f"run: {WAITING} until it is back: kafka at {broker} unreachable"
        eventually(lambda: named in log.read_text(), timeout_s=10, interval_s=0.2, what="lapse run naming the broker")
        assert time.monotonic() - started <= 10
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_BOUND_S) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
