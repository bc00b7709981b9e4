"""A small process tree (`lapse run`, `lapse demo`): each role in its own spawned process, restarted
if it dies; shutdown forwards SIGTERM, waits a bounded grace, then SIGKILLs the stragglers.

With a metrics port the supervisor serves the tree's one endpoint, summing the metric files every
role process writes to a fresh PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from prometheus_client import Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.registry import Collector
from setproctitle import setproctitle

from lapse.kernel.logs import configure_logging, get_logger, set_role
from lapse.kernel.settings import Settings
from lapse.shell.metrics import serving_process_tree

log = get_logger("supervisor")

# A child's body: `target(settings)`, run in its own spawned process (its result is ignored), so
# picklable: a module-level function or a partial of one (`lapse.shell.roles.child_of`).
RoleTarget = Callable[[Settings], object]
# How long shutdown waits after SIGTERM for the roles to finish their batch, commit and leave:
# under the 30 s a deployment usually allows, above a batch plus a consumer close.
SHUTDOWN_GRACE_S = 25.0
# The variable prometheus_client reads, at import, to write metrics to files shared by a process tree.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Set by each role process as it starts; one series per live process (its pid label), so a
# restarted role shows its new process only.
ROLE_STARTED = Gauge("lapse_role_start_time_seconds", "When each live role process started (Unix time; "
                     "the pid label tells the processes apart).", ["role"], multiprocess_mode="liveall")


@dataclass(frozen=True)
class Child:
    """One process of the tree: its name (`process-0`) and what it runs (`lapse.shell.roles.child_of`)."""

    name: str
    target: RoleTarget


def _child(target: RoleTarget, settings: Settings, role_name: str) -> None:
    # Each role process is its own claim owner: two processors sharing the parent's id could
    # complete each other's leases.
    settings = settings.with_(runtime={"worker_id": f"{settings.runtime.worker_id}/{role_name}-{os.getpid()}"})
    setproctitle(f"lapse: {role_name}")  # `ps` names the role, not a spawned interpreter
    set_role(role_name)
    configure_logging(settings)
    ROLE_STARTED.labels(role=role_name).set_to_current_time()  # the supervisor serves the tree's metrics
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when children stop
    target(settings)


class RolesCollector(Collector):
    """Each role's liveness and restarts, as the supervisor sees them at scrape time."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("lapse_role_up", "1 while the role's process runs, 0 when it is down.", labels=["role"])
        restarts = CounterMetricFamily("lapse_role_restarts", "Restarts of the role after its process died.",
                                       labels=["role"])
        for role in self.supervisor.roles:
            proc = self.supervisor.procs.get(role.name)
            up.add_metric([role.name], 1 if proc is not None and proc.is_alive() else 0)
            restarts.add_metric([role.name], self.supervisor.restarts[role.name])
        yield up
        yield restarts


class Supervisor:
    """Starts roles as spawned processes, restarts crashed ones, stops them all on request."""

    def __init__(self, settings: Settings, roles: list[Child], restart_delay_s: float = 1.0,
                 grace_s: float = SHUTDOWN_GRACE_S) -> None:
        self.settings = settings
        self.roles = roles
        self.restart_delay_s = restart_delay_s
        self.grace_s = grace_s
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, BaseProcess] = {}
        self.stop = threading.Event()  # set: stop watching and shut down
        self.hurry = threading.Event()  # set (a second signal): end the shutdown grace now
        self.restarts: Counter[str] = Counter()
        self.multiproc_dir: str | None = None  # the roles' metric files, while a metrics port is served
        self._env_before: str | None = None
        self._metrics = ExitStack()  # the tree's endpoint while it is served
        self._marked_dead: set[int] = set()

    def _start(self, role: Child) -> None:
        proc = self.ctx.Process(target=_child, args=(role.target, self.settings, role.name),
                                name=f"lapse-{role.name}", daemon=False)
        proc.start()
        self.procs[role.name] = proc
        log.info("role started", extra={"role": role.name, "pid": proc.pid})

    def _serve_metrics(self) -> None:
        """With a metrics port: a fresh directory for the roles' metric files, named in the
        environment the roles inherit, and the tree's one endpoint on that port."""
        if self.settings.runtime.metrics_port is None:
            return
        self.multiproc_dir = tempfile.mkdtemp(prefix="lapse-metrics-")
        self._env_before = os.environ.get(MULTIPROC_ENV)
        os.environ[MULTIPROC_ENV] = self.multiproc_dir  # read by each spawned role at its import
        self._metrics.enter_context(serving_process_tree(self.settings, self.multiproc_dir, RolesCollector(self)))

    def _mark_dead(self, proc: BaseProcess) -> None:
        """Forget an ended role process's `live…` gauges (its counters keep counting in the sums)."""
        if self.multiproc_dir is not None and proc.pid is not None and proc.pid not in self._marked_dead:
            mark_process_dead(proc.pid, self.multiproc_dir)
            self._marked_dead.add(proc.pid)

    def _stop_metrics(self) -> None:
        self._metrics.close()
        if self.multiproc_dir is not None:
            if self._env_before is None:
                os.environ.pop(MULTIPROC_ENV, None)
            else:
                os.environ[MULTIPROC_ENV] = self._env_before
            shutil.rmtree(self.multiproc_dir, ignore_errors=True)
            self.multiproc_dir = None

    def start(self) -> None:
        self._serve_metrics()
        for role in self.roles:
            self._start(role)

    def watch(self, until: Callable[[], bool] | None = None, poll_s: float = 0.5) -> None:
        """Restart roles that died unexpectedly until `until()` is true or `stop` is set."""
        while not self.stop.is_set() and not (until and until()):
            for role in self.roles:
                proc = self.procs[role.name]
                if not proc.is_alive() and proc.exitcode is not None:
                    self._mark_dead(proc)
                if not proc.is_alive() and proc.exitcode not in (0, None):
                    log.warning("role died, restarting", extra={"role": role.name, "exitcode": proc.exitcode})
                    time.sleep(self.restart_delay_s)
                    self.restarts[role.name] += 1
                    self._start(role)
            self.stop.wait(poll_s)

    def shutdown(self, grace_s: float | None = None) -> list[str]:
        """SIGTERM every running role (each finishes its step, commits what it owns and leaves),
        wait up to `grace_s` (default: the supervisor's) or until `hurry` is set, then SIGKILL the
        roles still running. Returns the names of the roles that had to be killed."""
        grace = self.grace_s if grace_s is None else grace_s
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + grace
        while (any(p.is_alive() for p in self.procs.values()) and time.monotonic() < deadline
               and not self.hurry.is_set()):
            wait([p.sentinel for p in self.procs.values() if p.is_alive()], timeout=0.2)
        killed = [name for name, proc in self.procs.items() if proc.is_alive()]
        for name in killed:
            self.procs[name].kill()
            self.procs[name].join()
            log.warning("role killed: it did not stop within the shutdown grace",
                        extra={"role": name, "grace_s": grace, "hurried": self.hurry.is_set()})
        for proc in self.procs.values():
            proc.join()
            self._mark_dead(proc)
        self._stop_metrics()
        return killed
