"""`lapse topics apply`: make the cluster's topics match topics.yaml, idempotently.

Creates missing topics and sets declared configs; reports what it will not fix (partition count,
replication factor) and exits 1 when such drift remains, so CI notices; 3 for a wrong topics file, 4
when the broker cannot be reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, pass_settings, setting_option

_VERB = {"create": ("created", "would create"), "alter_config": ("changed", "would change"),
         "drift": ("DRIFT", "DRIFT"), "error": ("ERROR", "ERROR")}


@main.group("topics")
def topics() -> None:
    """Declared topics and consumer groups (topics.yaml)."""


def _text(result: dict[str, Any]) -> str:
    if not result["actions"]:
        return "no change"
    lines = []
    for action in result["actions"]:
        done, planned = _VERB[action["kind"]]
        verb = planned if result["dry_run"] else done
        if action["status"] == "failed":
            verb = f"FAILED to {action['kind'].replace('_config', '')}"
        lines.append(f"{verb} {action['topic']}: {action['detail']}")
    return "\n".join(lines)


@topics.command("apply")
@setting_option("topics.file", "--file", type=click.Path(dir_okay=False, path_type=Path))
@setting_option("topics.prefix", "--topic-prefix")
@setting_option("kafka.bootstrap_servers", "--bootstrap-servers")
@setting_option("runtime.log_level", "--log-level")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--replication-factor", type=click.IntRange(min=1), default=None,
              help="Use this replication factor for every topic (1 for a single test broker).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@pass_settings
def topics_apply(settings: Settings, dry_run: bool, replication_factor: int | None, as_json: bool) -> None:
    """Create missing topics and set declared configs; report drift it cannot fix."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.kafka_clients import make_admin
    from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
    from lapse.kernel.provisioning import apply, plan
    from lapse.kernel.topology import load_topology

    # A wrong topics file (exit 3) or an unreachable broker (exit 4) is the error boundary's one line.
    leave_connection_failures_to_caller()
    declared = list(load_topology(settings.topics.file, settings.topics.prefix, replication_factor).specs)
    admin = make_admin(settings)
    actions = plan(admin, declared)
    if not dry_run:
        actions = apply(admin, actions)
    unresolved = [a for a in actions if not a.fixable or a.status == "failed"]
    result = {
        "dry_run": dry_run,
        "changed": any(a.status == "done" for a in actions),
        "ok": not unresolved,
        "actions": [a.to_dict() for a in actions],
    }
    emit(result, as_json, _text)
    if unresolved:
        raise SystemExit(1)
