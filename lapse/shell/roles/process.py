"""The process role: a cleanup worker in group lapse-cleanup until stopped (`lapse process`, each
`process-N` of `lapse run`), or until idle (`lapse process --exit-when-idle`)."""

from __future__ import annotations

import threading

from lapse.kernel.settings import Settings
from lapse.processors import CleanupWorker, WorkerStats
from lapse.shell.roles.base import StreamRole


class ProcessRole(StreamRole[WorkerStats]):
    """One cleanup worker; `exit_when_idle`: stop after that many seconds with nothing to do."""

    name = "process"

    def __init__(self, settings: Settings, *, exit_when_idle: float | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(settings, exit_when_idle=exit_when_idle, stop=stop)
        self.worker: CleanupWorker | None = None
        self.stats = WorkerStats()  # the worker's counts once it ran; zeros when stopped before it started
        self.ran = False

    def open(self) -> None:
        self.worker = CleanupWorker(self.settings, stop=self.stop)  # kinds read from the database here

    def run(self) -> WorkerStats:
        assert self.worker is not None, "run after open"
        self.ran = True  # the worker closes itself when its run ends
        self.stats = self.worker.run(exit_when_idle=self.exit_when_idle)
        return self.stats

    def close(self) -> None:
        try:
            if self.worker is not None and not self.ran:
                self.worker.close()
        finally:
            super().close()
