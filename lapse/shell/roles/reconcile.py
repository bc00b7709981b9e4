"""The reconcile role: re-emit lapsed work that never produced an event or got stuck, a pass every
`reconciler.interval_s` (`lapse reconcile`, `lapse run`), or one pass (`lapse reconcile --once`)."""

from __future__ import annotations

from lapse.kernel.codec import Codec
from lapse.reconciler import Reconciler, ReconcileReport
from lapse.shell.roles.base import PassRole, every_interval


class ReconcileRole(PassRole[ReconcileReport | None]):
    """The reconciler; `once`: one pass, reported. A failed pass of the service is logged and
    tried again at the next interval."""

    name = "reconcile"
    uses_kinds = True
    produces = True
    reconciler: Reconciler

    def open(self) -> None:
        super().open()
        self.reconciler = Reconciler(self.engine, self.producer, Codec.from_settings(self.settings), self.settings,
                                     self.kinds, stop=self.stop)

    def run(self) -> None:
        every_interval(self.name, self.stop, self.settings.reconciler.interval_s, self.run_once)

    def run_once(self) -> ReconcileReport:
        return self.reconciler.run_once()
