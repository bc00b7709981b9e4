"""The sweep role: emit expiry events for due business rows, a pass every `sweep_interval_s`
(`lapse sweep`, `lapse run`), or one pass (`lapse sweep --once`)."""

from __future__ import annotations

from lapse.kernel.codec import Codec
from lapse.producers import EmitWindow, SweepReport, sweep_once
from lapse.shell.roles.base import PassRole, when_reachable


class SweepRole(PassRole[SweepReport | None]):
    """The sweep; `once`: one pass, reported. Each kind's window of events in flight lasts across
    passes."""

    name = "sweep"
    uses_kinds = True
    produces = True
    windows: dict[str, EmitWindow] | None = None

    def run(self) -> None:
        while when_reachable(self.name, self.stop, self.run_once) is not None:
            self.stop.wait(self.settings.producer.sweep_interval_s)

    def run_once(self) -> SweepReport:
        if self.windows is None:
            self.windows = {}
        return sweep_once(self.engine, self.producer, Codec.from_settings(self.settings), self.settings, self.kinds,
                          stop=self.stop, windows=self.windows)
