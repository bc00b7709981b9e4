"""A small process tree: each role runs in its own process and is restarted if it dies.

`lapse run` and `lapse demo` use it; production deployments usually run each role as its own
service instead (see compose/).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from lapse.kernel.logs import configure_logging, get_logger
from lapse.kernel.settings import Settings
from lapse.shell.metrics import serve

log = get_logger("supervisor")

# A role's body: `target(settings, kwargs)`, run in the role's own process (its result is ignored).
RoleTarget = Callable[[Settings, dict[str, Any]], object]


@dataclass
class Role:
    name: str
    target: RoleTarget
    kwargs: dict[str, Any]


def _child(target: RoleTarget, settings: Settings, kwargs: dict[str, Any], role_name: str) -> None:
    # Each role process is its own claim owner: two processors sharing the parent's id could
    # complete each other's leases.
    settings = settings.with_(runtime={"worker_id": f"{settings.runtime.worker_id}/{role_name}-{os.getpid()}"})
    configure_logging(settings)
    serve(settings, kwargs.get("metrics_offset", 0))  # one port per role process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when children stop
    target(settings, kwargs)


class Supervisor:
    """Starts roles as spawned processes, restarts crashed ones, stops them all on request."""

    def __init__(self, settings: Settings, roles: list[Role], restart_delay_s: float = 1.0) -> None:
        self.settings = settings
        self.roles = roles
        self.restart_delay_s = restart_delay_s
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, BaseProcess] = {}
        self.stop = threading.Event()

    def _start(self, role: Role) -> None:
        proc = self.ctx.Process(target=_child, args=(role.target, self.settings, role.kwargs, role.name),
                                name=f"lapse-{role.name}", daemon=False)
        proc.start()
        self.procs[role.name] = proc
        log.info("role started", extra={"role": role.name, "pid": proc.pid})

    def start(self) -> None:
        for role in self.roles:
            self._start(role)

    def watch(self, until: Callable[[], bool] | None = None, poll_s: float = 0.5) -> None:
        """Restart roles that died unexpectedly until `until()` is true or `stop` is set."""
        while not self.stop.is_set() and not (until and until()):
            for role in self.roles:
                proc = self.procs[role.name]
                if not proc.is_alive() and proc.exitcode not in (0, None):
                    log.warning("role died, restarting", extra={"role": role.name, "exitcode": proc.exitcode})
                    time.sleep(self.restart_delay_s)
                    self._start(role)
            self.stop.wait(poll_s)

    def shutdown(self, timeout_s: float = 20.0) -> None:
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()  # SIGTERM: finish the batch, commit, leave the group
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
