"""The delay role: forward delay-tier records to lapse.expiry when due, until stopped (`lapse delay`,
`lapse run`). Its start waits for the broker to answer (`Role.check`); the database is asked only for its clock
(`Role.clock_watch`), and its absence delays nothing."""

from __future__ import annotations

import threading

from lapse.kernel.settings import Settings
from lapse.processors import DelayWorker
from lapse.shell.roles.base import Role


class DelayRole(Role[int]):
    """The delay-tier forwarder; `run` returns the records forwarded."""

    name = "delay"
    uses_database = False

    def __init__(self, settings: Settings, *, stop: threading.Event | None = None) -> None:
        super().__init__(settings, stop=stop)
        self.worker: DelayWorker | None = None
        self.ran = False

    def open(self) -> None:
        # Release times on the wall clock corrected by the skew last measured (`Role.clock_watch`).
        self.worker = self.worker or DelayWorker(self.settings, stop=self.stop, clock=self.clock_watch.now)

    def run(self) -> int:
        assert self.worker is not None, "run after open"
        self.ran = True  # the worker closes itself when its run ends
        return self.worker.run()

    def close(self) -> None:
        if self.worker is not None and not self.ran:
            self.worker.close()
