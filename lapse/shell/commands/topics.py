"""`lapse topics apply`: make the cluster's topics match topics.yaml, idempotently.

Creates missing topics and sets declared configs; reports what it will not fix (partition count,
replication factor) and exits 1 when such drift remains, so CI notices; 3 for a wrong topics file, 4
when the broker cannot be reached.

A destructive config change (lowering retention, changing cleanup.policy, lowering
min.insync.replicas) is shown by `--dry-run` and refused (exit 2, nothing changed) unless
`--allow-destructive` and a `--reason` are given; then it is applied and recorded as an operator
action in the database (who, as which database user, why, what changed).

ACLs: when topics.yaml names `principals:`, each role's ACLs are planned and created the same way
(shown by `--dry-run`); an ACL on this environment's topics or groups that the file does not declare
is drift (exit 1), removed only with `--allow-destructive` and a `--reason` (recorded like a
destructive config change). A broker without an authorizer has none to manage (the JSON says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode

_VERB = {"create": ("created", "would create"), "alter_config": ("changed", "would change"),
         "drift": ("DRIFT", "DRIFT"), "error": ("ERROR", "ERROR"),
         "create_acl": ("created ACL on", "would create ACL on"),
         "remove_acl": ("removed ACL on", "would remove ACL on")}
_NOUN = {"create": "create", "alter_config": "alter", "create_acl": "create ACL on", "remove_acl": "remove ACL on"}


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
            verb = f"FAILED to {_NOUN.get(action['kind'], action['kind'])}"
        elif action["status"] == "refused":
            verb = "REFUSED to change"
        line = f"{verb} {action['topic']}: {action['detail']}"
        if action["destructive"]:
            line += f" (DESTRUCTIVE: {'; '.join(action['destructive'])})"
        lines.append(line)
    return "\n".join(lines)


@topics.command("apply")
@setting_option("topics.file", "--file", type=click.Path(dir_okay=False, path_type=Path))
@setting_option("topics.prefix", "--topic-prefix")
@setting_option("kafka.bootstrap_servers", "--bootstrap-servers")
@setting_option("runtime.log_level", "--log-level")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--replication-factor", type=click.IntRange(min=1), default=None,
              help="Use this replication factor for every topic (1 for a single test broker).")
@click.option("--allow-destructive", is_flag=True,
              help="Also apply config changes that can lose data or weaken durability (lower "
                   "retention, another cleanup.policy, lower min.insync.replicas) and remove ACLs "
                   "topics.yaml does not declare; needs --reason.")
@click.option("--reason", default=None, help="Why the destructive changes are applied (recorded).")
@click.option("--actor", envvar="USER", show_envvar=True, default=None,
              help="Operator name recorded with a destructive apply.")
@setting_option("database.url", help="Where a destructive apply is recorded as an operator action.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@pass_settings
def topics_apply(settings: Settings, dry_run: bool, replication_factor: int | None, allow_destructive: bool,
                 reason: str | None, actor: str | None, as_json: bool) -> None:
    """Create missing topics, set declared configs and create each role's ACLs (topics.yaml
    `principals:`); report drift it cannot fix. Destructive changes (config changes that can lose
    data, removing undeclared ACLs) only with --allow-destructive (see them first with --dry-run)."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.kafka_clients import make_admin
    from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
    from lapse.kernel.topology import load_topology
    from lapse.shell.provisioning import NoAuthorizer, apply, plan, plan_acls, removals

    # A wrong topics file (exit 3) or an unreachable broker (exit 4) is the error boundary's one line.
    leave_connection_failures_to_caller()
    topology = load_topology(settings.topics.file, settings.topics.prefix, replication_factor)
    admin = make_admin(settings)
    actions = plan(admin, list(topology.specs))
    acls = "managed"
    if not topology.principals:
        acls = "not managed: the topics file names no principals"
    else:
        try:
            actions += plan_acls(admin, topology)
        except NoAuthorizer as exc:
            acls = f"not managed: the broker has no authorizer ({exc})"
    if allow_destructive:  # undeclared ACLs are drift unless their removal is asked for
        actions = removals(actions)
    destructive = [a for a in actions if a.destructive]
    if destructive and not dry_run:
        if not allow_destructive:
            raise CommandFailed(ExitCode.USAGE, (
                f"refused: {len(destructive)} destructive config change(s), nothing changed: "
                + "; ".join(f"{a.topic} {', '.join(a.destructive)}" for a in destructive)
                + " (see --dry-run; apply with --allow-destructive --reason TEXT)"))
        actions = _apply_recorded(settings, admin, actions, reason, actor)
    elif not dry_run:
        actions = apply(admin, actions)
    unresolved = [a for a in actions if not a.fixable or a.status == "failed"]
    result = {
        "dry_run": dry_run,
        "changed": any(a.status == "done" for a in actions),
        "ok": not unresolved,
        "acls": acls,
        "actions": [a.to_dict() for a in actions],
    }
    emit(result, as_json, _text)
    if unresolved:
        raise SystemExit(1)


def _apply_recorded(settings: Settings, admin: Any, actions: list[Any], reason: str | None,
                    actor: str | None) -> list[Any]:
    """Apply the plan with its destructive changes, recorded as one operator action. The record is
    written first, in the transaction that commits after the apply: a database that cannot take it
    (unreachable, not migrated) stops the apply before any change."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.clock import database_now
    from lapse.kernel.database import engine_from_settings
    from lapse.operator_actions import (
        TOPICS_APPLY_DESTRUCTIVE,
        OperatorAction,
        log_action,
        record_action,
        session_user,
    )
    from lapse.shell.provisioning import apply

    if not (reason or "").strip():
        raise click.UsageError("--allow-destructive needs --reason saying why")
    if not (actor or "").strip():
        raise click.UsageError("--allow-destructive needs --actor (or USER) naming the operator")
    assert reason is not None and actor is not None  # checked just above
    engine = engine_from_settings(settings)
    try:
        with engine.begin() as conn:
            destructive = [a for a in actions if a.destructive]
            changes: dict[str, dict[str, Any]] = {}
            for action in destructive:  # one entry per topic (an ACL's resource may have several)
                entry = changes.setdefault(action.topic, {"changes": {}, "destructive": []})
                entry["changes"].update(action.changes)
                entry["destructive"] += list(action.destructive)
            recorded = record_action(conn, OperatorAction(
                TOPICS_APPLY_DESTRUCTIVE, actor, reason, ", ".join(sorted({a.topic for a in destructive})),
                {"changes": changes}), database_now(conn), session_user(conn))
            done: list[Any] = apply(admin, actions, allow_destructive=True)
    finally:
        engine.dispose()
    log_action(recorded)
    return done
