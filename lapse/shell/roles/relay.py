"""The relay role: publish outbox rows (outcomes, dead letters) to Kafka in order until stopped
(`lapse relay`, `lapse run`), or until idle (`lapse relay --exit-when-idle`)."""

from __future__ import annotations

import threading

from confluent_kafka import Producer

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.settings import Settings
from lapse.producers import run_relay
from lapse.shell.roles.base import Role


class RelayRole(Role[int]):
    """The relay; `run` returns the rows relayed. `exit_when_idle`: stop after that long idle."""

    name = "relay"

    def __init__(self, settings: Settings, *, exit_when_idle: float | None = None,
                 stop: threading.Event | None = None) -> None:
        super().__init__(settings, stop=stop)
        self.exit_when_idle = exit_when_idle
        self.producer: Producer | None = None

    @property
    def bounded(self) -> bool:
        return self.exit_when_idle is not None

    @property
    def stops_on_signals(self) -> bool:
        return True  # idle or not, a SIGTERM ends it after its step

    def open(self) -> None:
        self.producer = make_producer(self.settings)

    def run(self) -> int:
        assert self.producer is not None, "run after open"
        producer_settings = self.settings.producer
        return run_relay(self.engine, self.producer, Codec.from_settings(self.settings),
                         limit=producer_settings.relay_batch_size, idle_s=producer_settings.relay_interval_s,
                         stop=self.stop, exit_when_idle=self.exit_when_idle)

    def close(self) -> None:
        try:
            if self.producer is not None:
                self.producer.flush(10)
        finally:
            super().close()
