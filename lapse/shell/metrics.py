"""The Prometheus endpoint of Lapse's long-running processes, served on `metrics_port` at
`metrics_bind` (127.0.0.1 unless configured: this host only).

- A single-role command (`lapse process`, `lapse relay`, …) serves its own process's registry
  (`serve`); the processor's batch counters are defined in its room (`lapse.processors.metrics`).
- `lapse run` serves one endpoint for its whole process tree (`serving_process_tree`): the roles
  write their metrics to files in a directory of their own (prometheus_client's multiprocess mode)
  and the supervisor's endpoint sums them, plus the status samples, read once, by the parent.
- The status samples (`lapse status` figures) come from a scrape-time collector
  (`lapse.shell.status_collector`); `monitor` serves them from a `lapse status --watch` process.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.shell.status_collector import status_collector

log = get_logger("metrics")

_served: set[int] = set()


class ProcessTreeCollector(MultiProcessCollector):
    """The metric files of a process tree, merged, leaving out a file a role process is still
    creating (empty for an instant) and one removed as listed (a process marked dead): a scrape
    while a role starts or ends must not fail."""

    def __init__(self, registry: CollectorRegistry, path: str) -> None:
        self.path = path
        super().__init__(registry, path=path)

    def collect(self) -> Iterable[Metric]:
        for _ in range(3):
            files = []
            for name in glob.glob(os.path.join(self.path, "*.db")):
                try:
                    if os.path.getsize(name) >= 8:  # the header a writer puts first
                        files.append(name)
                except FileNotFoundError:
                    continue
            try:
                return self.merge(files, accumulate=True)  # type: ignore[no-any-return]
            except FileNotFoundError:  # removed since listed: list again
                continue
        return []


def serve(settings: Settings) -> int | None:
    """Serve this process's metrics on settings.runtime.metrics_port (once per process) at
    settings.runtime.metrics_bind; None when no port is set."""
    port = settings.runtime.metrics_port
    if port is None:
        return None
    if port not in _served:
        start_http_server(port, addr=settings.runtime.metrics_bind)
        _served.add(port)
        log.info("metrics served", extra={"port": port, "bind": settings.runtime.metrics_bind})
    return port


@contextmanager
def serving_process_tree(settings: Settings, multiproc_dir: str, *collectors: Collector) -> Iterator[int | None]:
    """While in the block, serve on metrics_port the metrics every process of a tree writes to
    `multiproc_dir` (counters and histograms summed over processes, gauges by their
    `multiprocess_mode`), the status samples and `collectors`; yields the port (None: no port set,
    nothing served)."""
    port = settings.runtime.metrics_port
    if port is None:
        yield None
        return
    registry = CollectorRegistry()
    ProcessTreeCollector(registry, multiproc_dir)
    for collector in collectors:
        registry.register(collector)
    with status_collector(settings) as status:
        registry.register(status)
        server, _ = start_http_server(port, addr=settings.runtime.metrics_bind, registry=registry)
        log.info("metrics of the process tree served", extra={"port": port, "bind": settings.runtime.metrics_bind})
        try:
            yield port
        finally:
            server.shutdown()
            server.server_close()


def monitor(settings: Settings, stop: threading.Event, interval_s: float = 15.0) -> None:
    """Add the status samples to this process's metrics, each reading serving scrapes for up to
    `interval_s`, and wait until stopped (`lapse status --watch`, compose's monitor service)."""
    with status_collector(settings, max_age_s=interval_s) as status:
        REGISTRY.register(status)
        try:
            stop.wait()
        finally:
            REGISTRY.unregister(status)
