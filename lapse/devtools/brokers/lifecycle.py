"""The lifecycle the brokers started here share: a `LocalBroker` (a broker or a cluster) works in a
folder it may have made, which `close()` deletes, and a `with` block starts and closes it; a
`BrokerProcess` (Apache Kafka from the jars, embedded tansu) is one process on loopback with its log,
started and waited for, stopped and killed the same way whatever the kind."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Self

from lapse.devtools.brokers.processes import terminate_process, wait_for_brokers


class LocalBroker(ABC):
    """Brokers this process starts, working in `folder` (a temp dir unless given); `close()` stops
    them and deletes a folder this object created itself."""

    def __init__(self, folder: str | Path | None, temp_prefix: str) -> None:
        self._own_dir = folder is None
        self.folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix=temp_prefix))

    @abstractmethod
    def start(self) -> Self:
        """Start and wait until the brokers serve; returns self."""

    @abstractmethod
    def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown, SIGKILL after `timeout`; the folder stays."""

    def close(self) -> None:
        """Stop and, if this object created the folder, delete it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class BrokerProcess(LocalBroker):
    """One broker process on 127.0.0.1:`port` with its log in `folder`; a subclass says how to
    launch it."""

    what: ClassVar[str]  # the broker's name in error messages
    log_name: ClassVar[str]  # its log file, in `folder`
    stop_timeout: ClassVar[float]  # stop()'s default wait between SIGTERM and SIGKILL
    failed_start_grace: ClassVar[float]  # that wait for a broker that did not come up

    def __init__(self, port: int | None, folder: str | Path | None, temp_prefix: str,
                 start_timeout: float) -> None:
        super().__init__(folder, temp_prefix)
        self.port = port
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise RuntimeError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.folder / self.log_name

    @abstractmethod
    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to serve; sets `self.proc` and returns it."""

    def start(self) -> Self:
        """Launch and wait until an AdminClient sees the broker; returns self."""
        proc = self.launch()
        try:
            wait_for_brokers(self.bootstrap, 1, [proc], [self.log_path], self.start_timeout, self.what)
        except BaseException:
            self.stop(self.failed_start_grace)
            raise
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown (SIGTERM), SIGKILL after `timeout` (default: the kind's `stop_timeout`);
        the folder stays."""
        terminate_process(self.proc, self.stop_timeout if timeout is None else timeout)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash would; the folder stays."""
        self.stop(0)
