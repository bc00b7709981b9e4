"""The relay role: publish outbox rows (outcomes, dead letters) to Kafka in order until stopped
(`lapse relay`, `lapse run`), or until idle (`lapse relay --exit-when-idle`)."""

from __future__ import annotations

from lapse.kernel.codec import Codec
from lapse.producers import run_relay
from lapse.shell.roles.base import StreamRole


class RelayRole(StreamRole[int]):
    """The relay; `run` returns the rows relayed."""

    name = "relay"
    produces = True

    def run(self) -> int:
        producer_settings = self.settings.producer
        return run_relay(self.engine, self.producer, Codec.from_settings(self.settings),
                         limit=producer_settings.relay_batch_size, idle_s=producer_settings.relay_interval_s,
                         stop=self.stop, exit_when_idle=self.exit_when_idle)
