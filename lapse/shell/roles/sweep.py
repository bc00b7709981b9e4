"""The sweep role: emit expiry events for due business rows, a pass every `sweep_interval_s`
(`lapse sweep`, `lapse run`), or one pass (`lapse sweep --once`)."""

from __future__ import annotations

import threading

from confluent_kafka import Producer

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import CleanupKind, load_kinds
from lapse.kernel.settings import Settings
from lapse.producers import SweepReport, sweep_once
from lapse.shell.roles.base import Role, when_reachable


class SweepRole(Role[SweepReport | None]):
    """The sweep; `once`: one pass, reported."""

    name = "sweep"

    def __init__(self, settings: Settings, *, once: bool = False, stop: threading.Event | None = None) -> None:
        super().__init__(settings, stop=stop)
        self.once = once
        self.kinds: dict[str, CleanupKind] = {}
        self.producer: Producer | None = None

    @property
    def bounded(self) -> bool:
        return self.once

    def check(self) -> None:
        super().check()
        self.kinds = load_kinds(self.settings, self.engine)  # compiled against the database

    def open(self) -> None:
        self.producer = self.producer or make_producer(self.settings)
        self.codec = Codec.from_settings(self.settings)

    def run(self) -> None:
        while when_reachable(self.name, self.stop, self.run_once) is not None:
            self.stop.wait(self.settings.producer.sweep_interval_s)

    def run_once(self) -> SweepReport:
        assert self.producer is not None, "run_once after open"
        return sweep_once(self.engine, self.producer, self.codec, self.settings, self.kinds, stop=self.stop)

    def close(self) -> None:
        try:
            if self.producer is not None:
                self.producer.flush(10)
        finally:
            super().close()
