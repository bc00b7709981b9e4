"""The reconcile role: re-emit lapsed work that never produced an event or got stuck, a pass every
`reconciler.interval_s` (`lapse reconcile`, `lapse run`), or one pass (`lapse reconcile --once`)."""

from __future__ import annotations

import threading

from confluent_kafka import Producer

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import CleanupKind, load_kinds
from lapse.kernel.settings import Settings
from lapse.reconciler import Reconciler, ReconcileReport
from lapse.shell.roles.base import Role, every_interval


class ReconcileRole(Role[ReconcileReport | None]):
    """The reconciler; `once`: one pass, reported. A failed pass of the service is logged and
    tried again at the next interval."""

    name = "reconcile"

    def __init__(self, settings: Settings, *, once: bool = False, stop: threading.Event | None = None) -> None:
        super().__init__(settings, stop=stop)
        self.once = once
        self.kinds: dict[str, CleanupKind] = {}
        self.producer: Producer | None = None
        self.reconciler: Reconciler | None = None

    @property
    def bounded(self) -> bool:
        return self.once

    def check(self) -> None:
        super().check()
        self.kinds = load_kinds(self.settings, self.engine)  # compiled against the database

    def open(self) -> None:
        self.producer = self.producer or make_producer(self.settings)
        self.reconciler = Reconciler(self.engine, self.producer, Codec.from_settings(self.settings), self.settings,
                                     self.kinds, stop=self.stop)

    def run(self) -> None:
        every_interval(self.name, self.stop, self.settings.reconciler.interval_s, self.run_once)

    def run_once(self) -> ReconcileReport:
        assert self.reconciler is not None, "run_once after open"
        return self.reconciler.run_once()

    def close(self) -> None:
        try:
            if self.producer is not None:
                self.producer.flush(10)
        finally:
            super().close()
