"""The long-running roles (sweep, process, relay, delay, reconcile, report, prune, console): one
module each, one `Role` base (`base`) and one registry (`registry`), used alike by `lapse run`,
each single-role command and its `--once`."""

from lapse.shell.roles.base import Role, every_interval, is_outage, run_role, when_reachable
from lapse.shell.roles.registry import ROLES, pipeline_roles, role_process, serve_registered

__all__ = ["ROLES", "Role", "every_interval", "is_outage", "pipeline_roles", "role_process", "run_role",
           "serve_registered", "when_reachable"]
