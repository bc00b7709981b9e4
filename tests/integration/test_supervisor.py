"""The process tree behind `lapse run` and `lapse demo`."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

from lapse.kernel.logs import get_logger
from lapse.kernel.settings import load_settings
from lapse.shell.signals import stop_on_signals
from lapse.shell.supervisor import Child, Supervisor
from tests.fixtures.polling import eventually


def write_worker_id(settings, *, out: str) -> None:
    Path(out).write_text(settings.runtime.worker_id)


def test_each_role_process_is_its_own_claim_owner(tmp_path):
    settings = load_settings(runtime={"worker_id": "host-1"})
    roles = [Child(f"process-{i}", partial(write_worker_id, out=str(tmp_path / f"{i}.txt"))) for i in range(2)]
    sup = Supervisor(settings, roles)
    sup.start()
    sup.watch(until=lambda: all(not p.is_alive() for p in sup.procs.values()), poll_s=0.1)
    sup.shutdown()
    owners = {(tmp_path / f"{i}.txt").read_text() for i in range(2)}
    assert len(owners) == 2
    assert all(owner.startswith("host-1/process-") for owner in owners)


def write_command_line(settings, *, out: str) -> None:
    """What `ps` shows of this role process, and the database URL it was given."""
    Path(out).write_text(Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()
                         + "\n" + settings.database.url_plain())


def test_a_role_process_gets_the_settings_through_a_pipe_not_its_command_line(tmp_path):
    """`lapse run` spawns its roles: the settings, secrets included, travel pickled through a pipe,
    so a role's command line (what every user sees in `ps`) holds none of them."""
    url = "postgresql+psycopg://lapse:role-s3cret-77@db.example:5432/lapse"
    roles = [Child("process-0", partial(write_command_line, out=str(tmp_path / "seen.txt")))]
    sup = Supervisor(load_settings(database={"url": url}), roles)
    sup.start()
    sup.watch(until=lambda: all(not p.is_alive() for p in sup.procs.values()), poll_s=0.1)
    sup.shutdown()
    command_line, given = (tmp_path / "seen.txt").read_text().split("\n")
    assert given == url and command_line.startswith("lapse: process-0")
    assert "role-s3cret-77" not in command_line


def test_each_role_process_is_named_in_ps_and_in_its_log_lines(tmp_path):
    """`ps` shows `lapse: process-0`, not a spawned interpreter; the role's log lines carry its name."""
    log_file = tmp_path / "roles.log"
    roles = [Child(f"process-{i}", partial(stop_on_sigterm, ready=str(tmp_path / f"ready-{i}"))) for i in range(2)]
    sup = Supervisor(load_settings(runtime={"log_file": log_file, "log_format": "json"}), roles, grace_s=10)
    sup.start()
    try:
        eventually(lambda: all((tmp_path / f"ready-{i}").exists() for i in range(2)), timeout_s=60, what="roles ready")
        shown = {name: Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                 for name, proc in sup.procs.items()}
    finally:
        assert sup.shutdown() == []
    assert shown == {"process-0": "lapse: process-0", "process-1": "lapse: process-1"}
    stopping = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert {(line["role"], line["msg"]) for line in stopping} >= {("process-0", "stopping"), ("process-1", "stopping")}


def stop_on_sigterm(settings, *, ready: str) -> None:
    stop = stop_on_signals()
    Path(ready).write_text("ready")
    stop.wait(120)
    get_logger("test").info("stopping")


def ignore_sigterm(settings, *, ready: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(ready).write_text("ready")
    time.sleep(120)


def started(tmp_path, roles: list[Child], grace_s: float) -> Supervisor:
    sup = Supervisor(load_settings(), roles, grace_s=grace_s)
    sup.start()
    eventually(lambda: all(Path(r.target.keywords["ready"]).exists() for r in roles), timeout_s=60, what="roles ready")
    return sup


def test_shutdown_forwards_sigterm_and_kills_only_the_roles_that_outlive_the_grace(tmp_path):
    roles = [Child("polite", partial(stop_on_sigterm, ready=str(tmp_path / "polite"))),
             Child("deaf", partial(ignore_sigterm, ready=str(tmp_path / "deaf")))]
    sup = started(tmp_path, roles, grace_s=1.0)
    assert sup.shutdown() == ["deaf"]
    assert sup.procs["polite"].exitcode == 0
    assert sup.procs["deaf"].exitcode == -signal.SIGKILL


def test_a_second_signal_ends_the_grace(tmp_path):
    sup = started(tmp_path, [Child("deaf", partial(ignore_sigterm, ready=str(tmp_path / "deaf")))], grace_s=600)
    sup.hurry.set()  # what a second SIGTERM or Ctrl-C does (stop_on_signals(sup.stop, hurry=sup.hurry))
    assert sup.shutdown() == ["deaf"]
    assert sup.procs["deaf"].exitcode == -signal.SIGKILL


def test_the_first_signal_stops_and_later_ones_hurry():
    stop, hurry = threading.Event(), threading.Event()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_signals(stop, hurry=hurry)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.is_set() and not hurry.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert hurry.is_set()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
