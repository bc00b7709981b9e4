"""A small process tree: each role runs in its own process and is restarted if it dies.

`lapse run` and `lapse demo` use it; production deployments usually run each role as its own
service instead (see compose/). Shutdown forwards SIGTERM to every role, waits a bounded grace
for each to finish its step and leave, then SIGKILLs the stragglers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from lapse.kernel.logs import configure_logging, get_logger
from lapse.kernel.settings import Settings
from lapse.shell.metrics import serve

log = get_logger("supervisor")

# A role's body: `target(settings, kwargs)`, run in the role's own process (its result is ignored).
RoleTarget = Callable[[Settings, dict[str, Any]], object]
# How long shutdown waits after SIGTERM for the roles to finish their batch, commit and leave:
# under the 30 s a deployment usually allows, above a batch plus a consumer close.
SHUTDOWN_GRACE_S = 25.0


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

    def __init__(self, settings: Settings, roles: list[Role], restart_delay_s: float = 1.0,
                 grace_s: float = SHUTDOWN_GRACE_S) -> None:
        self.settings = settings
        self.roles = roles
        self.restart_delay_s = restart_delay_s
        self.grace_s = grace_s
        self.ctx = mp.get_context("spawn")
        self.procs: dict[str, BaseProcess] = {}
        self.stop = threading.Event()  # set: stop watching and shut down
        self.hurry = threading.Event()  # set (a second signal): end the shutdown grace now

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
        return killed
