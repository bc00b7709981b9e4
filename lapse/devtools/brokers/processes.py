"""Broker processes on loopback: a free port, launching one with its output in a log, waiting until
the brokers serve, terminating one, and killing at exit whatever is still running."""

from __future__ import annotations

import atexit
import socket
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from lapse.devtools.brokers.unavailable import BrokerUnavailable

_RUNNING: set[subprocess.Popen[bytes]] = set()


def free_port() -> int:
    """A loopback TCP port free right now (the OS picks it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback TCP ports free right now. Each socket stays bound until all are
    picked: asked one after another, the OS may hand out a closed one's port again (a broker's two
    listeners once got the same port, and the broker refused to start)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]  # (host, port) for AF_INET
    finally:
        for sock in socks:
            sock.close()


def summarize_output(text: str, lines: int) -> str:
    """The last `lines` meaningful lines of a log or of java's stderr, joined into one line
    (Java stack frames dropped, so the exception message itself survives the cut)."""
    kept = [line.strip() for line in text.splitlines()
            if line.strip() and not line.startswith(("\t", " ")) and not line.startswith("Caused by: ")]
    errors = [line for line in kept if any(w in line for w in (" ERROR ", " FATAL ", "Exception", "rror:"))]
    return " | ".join((errors or kept)[-lines:]).replace('Exception in thread "main" ', "")


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return summarize_output(text, lines) or "(empty log)"


def launch_process(cmd: list[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start `cmd` in its own session (Ctrl-C in a terminal reaches us, not it), output to a log."""
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed once it started
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    _RUNNING.add(proc)
    return proc


def terminate_process(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; always reaps the process."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _RUNNING.discard(proc)


@atexit.register
def _kill_leftovers() -> None:
    """A broker never outlives the Python process that started it (crash, forgotten stop)."""
    for proc in list(_RUNNING):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _RUNNING.clear()


def wait_for_brokers(bootstrap: str, count: int, procs: list[subprocess.Popen[bytes]],
                     logs: list[Path], timeout: float, what: str) -> None:
    """Block until an AdminClient sees `count` brokers; a dead process or the timeout raises."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 2000,
                         "log_level": 0})  # "connection refused" until it listens is expected
    deadline = time.monotonic() + timeout
    while True:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                raise BrokerUnavailable(
                    f"{what} exited with status {proc.returncode} during start; log {log}: "
                    f"{_log_tail(log)}"
                )
        try:
            if len(admin.list_topics(timeout=2).brokers) >= count:
                return
        except Exception:  # KafkaException while the listener is not up yet
            pass
        if time.monotonic() > deadline:
            raise BrokerUnavailable(
                f"{what} not ready on {bootstrap} after {timeout:.0f}s; log {logs[0]}: "
                f"{_log_tail(logs[0])}"
            )
        time.sleep(0.2)
