"""The prune role: retention, a prune pass every `retention.interval_s` until stopped (`lapse prune
--watch`, `lapse run`), or one pass (`lapse prune`, `--dry-run` to count only)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from lapse.kernel.clock import engine_now
from lapse.kernel.settings import Settings
from lapse.retention import PruneReport, horizons_from_settings, prune_dry_run, prune_once
from lapse.shell.roles.base import PassRole, every_interval


class PruneRole(PassRole[PruneReport | None]):
    """Retention in bounded batches that stop between batches on SIGTERM. A horizon shorter than
    topics.yaml allows is refused when built (HorizonRefused), before any work."""

    name = "prune"
    uses_kafka = False

    def __init__(self, settings: Settings, *, once: bool = False, dry_run: bool = False,
                 progress: Callable[[str, int], None] | None = None, stop: threading.Event | None = None) -> None:
        super().__init__(settings, once=once, stop=stop)
        self.dry_run = dry_run
        self.progress = progress
        self.horizons = horizons_from_settings(settings)

    def run(self) -> None:
        every_interval(self.name, self.stop, self.settings.retention.interval_s, self.run_once)

    def run_once(self) -> PruneReport:
        now = engine_now(self.engine)  # the prune horizon and the partitions ahead: the database's clock
        if self.dry_run:
            return prune_dry_run(self.engine, self.horizons, now)
        return prune_once(self.engine, self.horizons, now, self.settings.retention.batch_size, stop=self.stop,
                          progress=self.progress)
