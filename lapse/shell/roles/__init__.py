"""The long-running roles (sweep, process, relay, delay, reconcile, report, prune, console, archive): one
module each, one `Role` base (`base`) and one registry (`registry`), used alike by `lapse run`,
each single-role command and its `--once`."""

from lapse.shell.roles.archive import ArchiveRole
from lapse.shell.roles.base import PassRole, Role, StreamRole, every_interval, is_outage, run_role, when_reachable
from lapse.shell.roles.console import ConsoleRole
from lapse.shell.roles.delay import DelayRole
from lapse.shell.roles.process import ProcessRole
from lapse.shell.roles.prune import PruneRole
from lapse.shell.roles.reconcile import ReconcileRole
from lapse.shell.roles.registry import ROLES, child_of, pipeline_roles, serve_registered
from lapse.shell.roles.relay import RelayRole
from lapse.shell.roles.report import ReportRole
from lapse.shell.roles.sweep import SweepRole

__all__ = [
    "ROLES",
    "ArchiveRole",
    "ConsoleRole",
    "DelayRole",
    "PassRole",
    "ProcessRole",
    "PruneRole",
    "ReconcileRole",
    "RelayRole",
    "ReportRole",
    "Role",
    "StreamRole",
    "SweepRole",
    "child_of",
    "every_interval",
    "is_outage",
    "pipeline_roles",
    "run_role",
    "serve_registered",
    "when_reachable",
]
