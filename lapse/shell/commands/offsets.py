"""`lapse offsets reset`: move a stopped consumer group's committed offsets (dry run by default).

Only the consumer groups topics.yaml declares, unless `--any-group`; an executed reset needs a
`--reason` and is recorded as an operator action (actor, database user, offsets before and after).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.time_args import TIMESTAMP, TIMESTAMP_FORMS


@main.group()
def offsets() -> None:
    """Consumer group offsets."""


def _text(data: dict[str, Any]) -> str:
    lines = [f"{r['topic']}[{r['partition']}]: {'-' if r['old'] is None else r['old']} -> {r['new']}"
             for r in data["partitions"]]
    lines.append(f"group {data['group']}: " + ("offsets reset" if data["executed"]
                                                else "dry run, nothing changed (add --execute)"))
    return "\n".join(lines)


@offsets.command("reset")
@connection_options
@click.option("--group", required=True, help="Consumer group to move.")
@click.option("--topic", help="Only this topic (default: the topics topics.yaml says the group reads).")
@click.option("--to-datetime", type=TIMESTAMP, help=f"First offset at or after this time ({TIMESTAMP_FORMS}).")
@click.option("--to-earliest", is_flag=True, help="The earliest retained offset.")
@click.option("--shift-by", type=int, help="Move by N records (negative: re-read), within the log.")
@click.option("--execute", is_flag=True, help="Commit the new offsets (default: only show them).")
@click.option("--any-group", is_flag=True, help="Allow a group topics.yaml does not declare.")
@click.option("--reason", default=None, help="Why the offsets are moved (required with --execute; recorded).")
@click.option("--actor", envvar="USER", show_envvar=True, default=None,
              help="Operator name recorded with an executed reset.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@pass_settings
def reset(settings: Settings, group: str, topic: str | None, to_datetime: datetime | None, to_earliest: bool,
          shift_by: int | None, execute: bool, any_group: bool, reason: str | None, actor: str | None,
          as_json: bool) -> None:
    """Show (and with --execute, commit) old -> new offsets per partition for GROUP.

    GROUP must be one topics.yaml declares, unless --any-group. Refuses while the group has active
    members. Note: the embedded tansu broker lists no members of an active group, so there this
    check cannot see running consumers; Apache Kafka reports them. An executed reset is recorded as
    an operator action in the database."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.kafka_clients import make_admin
    from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
    from lapse.readers import OffsetsError, plan_reset

    if sum((to_datetime is not None, to_earliest, shift_by is not None)) != 1:
        raise click.UsageError("give exactly one of --to-datetime, --to-earliest, --shift-by")
    declared = settings.topology.declared_groups()
    if group not in declared and not any_group:
        raise CommandFailed(ExitCode.USAGE, f"group {group} is not declared in topics.yaml (declared: "
                            f"{', '.join(declared) or 'none'}): add --any-group to reset it anyway")
    if execute and not (reason or "").strip():
        raise click.UsageError("--execute needs --reason saying why")
    if execute and not (actor or "").strip():
        raise click.UsageError("--execute needs --actor (or USER) naming the operator")
    how = ("to-earliest" if to_earliest else f"to-datetime {to_datetime.isoformat()}" if to_datetime
           else f"shift-by {shift_by}")
    topics = [topic] if topic else sorted({t for g, t in settings.topology.reads() if g == group})
    leave_connection_failures_to_caller()  # an unreachable broker is the error boundary's one line
    try:
        plan = plan_reset(settings, group, topics, to_datetime=to_datetime, to_earliest=to_earliest,
                          shift_by=shift_by)
        if execute:
            assert reason is not None and actor is not None  # checked above
            _execute_recorded(settings, make_admin(settings), group, plan, how, reason, actor)
    except OffsetsError as exc:  # refused: the group is active, or its topic is not there
        raise CommandFailed(ExitCode.PROBLEM_FOUND, str(exc)) from None
    emit({"group": group, "executed": execute, "partitions": [asdict(r) for r in plan]}, as_json, _text)


def _execute_recorded(settings: Settings, admin: Any, group: str, plan: list[Any], how: str, reason: str,
                      actor: str) -> None:
    """Commit the planned offsets, recorded as one operator action. The record is written first, in
    the transaction that commits after the reset: a database that cannot take it stops the reset
    before it happens, and a refused reset (an active group) leaves no record."""
    # function-local: keeps `lapse --help` fast
    from datetime import UTC
    from datetime import datetime as clock

    from lapse.kernel.database import engine_from_settings
    from lapse.operator_actions import (
        OFFSETS_RESET,
        OperatorAction,
        log_action,
        record_action,
        session_user,
    )
    from lapse.readers import execute_reset

    engine = engine_from_settings(settings)
    try:
        with engine.begin() as conn:
            recorded = record_action(conn, OperatorAction(OFFSETS_RESET, actor, reason, f"group {group}", {
                "group": group, "how": how, "partitions": [asdict(r) for r in plan]}),
                clock.now(UTC), session_user(conn))
            execute_reset(admin, group, plan)
    finally:
        engine.dispose()
    log_action(recorded)
