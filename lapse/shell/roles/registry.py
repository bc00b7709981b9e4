"""The one registry of long-running roles, by name: a new role is a module with its `Role` class
and one entry in ROLES. The supervisor runs a registered role by name in its own process."""

from __future__ import annotations

from functools import partial
from typing import Any

from lapse.kernel.settings import Settings
from lapse.shell.roles.archive import ArchiveRole
from lapse.shell.roles.base import Role, run_role
from lapse.shell.roles.console import ConsoleRole
from lapse.shell.roles.delay import DelayRole
from lapse.shell.roles.process import ProcessRole
from lapse.shell.roles.prune import PruneRole
from lapse.shell.roles.reconcile import ReconcileRole
from lapse.shell.roles.relay import RelayRole
from lapse.shell.roles.report import ReportRole
from lapse.shell.roles.sweep import SweepRole
from lapse.shell.supervisor import Child

ROLES: dict[str, type[Role[Any]]] = {role.name: role for role in (
    SweepRole, ProcessRole, RelayRole, DelayRole, ReconcileRole, ReportRole, PruneRole, ConsoleRole, ArchiveRole)}


def serve_registered(role: str, settings: Settings) -> None:
    """The registered role `role` as a service, in this process until stopped (a supervisor target)."""
    run_role(ROLES[role](settings))


def child_of(role: str, name: str | None = None) -> Child:
    """The child of the tree that runs the registered role `role` as a service, named `name` (default: the role)."""
    if role not in ROLES:
        raise KeyError(f"no role {role!r}; the roles are {', '.join(ROLES)}")
    return Child(name or role, partial(serve_registered, role))


def pipeline_roles(workers: int, *, console: bool = False, archive: bool = False) -> list[Child]:
    """`lapse run`'s processes: a sweep, a relay, `workers` processors, the delay-tier forwarder,
    the reconciler, the daily report and prune, with `console` the operator console and with
    `archive` the archive."""
    processes = [child_of("sweep"), child_of("relay")]
    processes += [child_of("process", f"process-{i}") for i in range(workers)]
    processes += [child_of(role) for role in ("delay", "reconcile", "report", "prune")]
    if console:
        processes.append(child_of("console"))
    if archive:
        processes.append(child_of("archive"))
    return processes
