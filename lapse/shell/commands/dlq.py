"""`lapse dlq list`, `lapse dlq replay` and `lapse dlq discard`: dead letters are released, or
given up for good, only by an operator.

A replay names what it releases (`--kind`, `--tenant`, `--op-key`, or `--all`), says how many
dead letters that is and asks before releasing them (`--yes` answers for a script; without a
terminal and without `--yes` it refuses); `--dry-run` only counts. A replay that releases anything
is recorded as an operator action (actor, reason, database user, selection, count, replay id).
A discard follows the same rules (a selection, a reason, the count confirmed, `--dry-run`) and
moves dead letters to `discarded`: never retried, never replayed, pruned with the dead letters.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import F, emit, log_options, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode


def _selection_options(func: F) -> F:
    for opt in reversed([
        setting_option("database.url"),
        log_options,
        click.option("--kind", default=None, help="Only this cleanup kind."),
        click.option("--tenant", default=None, help="Only this tenant."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]):
        func = opt(func)
    return func


def _operator_options(action: str, done: str, why: str) -> Callable[[F], F]:
    """The options of an operator action on dead letters (`action` a verb, `done` its past
    participle, `why` what the reason explains): a bounded, explicit selection, a reason and an
    actor, a dry run and the confirmation."""
    def decorate(func: F) -> F:
        for opt in reversed([
            click.option("--limit", type=click.IntRange(1, 10_000), required=True,
                         help=f"Most dead letters {done} by this action (required)."),
            click.option("--reason", required=True, help=f"Why {why}, kept in the audit trail."),
            click.option("--op-key", "op_keys", multiple=True, help="Only these op keys (repeatable)."),
            click.option("--actor", envvar="USER", show_envvar=True, required=True,
                         help=f"Operator name recorded with the {action}."),
            click.option("--all", "select_all", is_flag=True,
                         help="Select every dead letter (instead of --kind, --tenant or --op-key)."),
            click.option("--dry-run", is_flag=True, help=f"Only count what would be {done}; change nothing."),
            click.option("--yes", is_flag=True, help=f"{action.capitalize()} without asking (for scripts)."),
        ]):
            func = opt(func)
        return func
    return decorate


@main.group()
def dlq() -> None:
    """Inspect, replay or discard dead letters (never replayed automatically)."""


def _list_text(data: dict[str, Any]) -> str:
    lines = []
    for r in data["dead_letters"]:
        if r["poison"]:
            src, at = r["source"], r["dlq"]
            lines.append(f"poison  {src['topic']}[{src['partition']}]@{src['offset']}  (dlq {at['partition']}@"
                         f"{at['offset']})  {(r['last_failure'] or '')[:100]}")
        else:
            lines.append(f"{r['op_key']}  {r['tenant']}  attempt={r['attempt']}  {r['last_failure_class']}: "
                         f"{(r['last_failure'] or '')[:100]}"
                         + (f"  (replayed {r['replay_id']})" if r["replay_id"] else ""))
    return "\n".join(lines or ["no dead letters"])


@dlq.command("list")
@_selection_options
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="Most dead letters of the ledger, and most poison records, to list.")
@setting_option("kafka.bootstrap_servers")
@setting_option("topics.prefix")
@click.option("--poison/--no-poison", default=True, show_default=True,
              help="Also list poison records, read from the DLQ topic (they have no ledger row).")
@pass_settings
def dlq_list(settings: Settings, kind: str | None, tenant: str | None, as_json: bool, limit: int,
             poison: bool) -> None:
    """Dead-lettered operations, oldest first, with their last failure; then the poison records on
    the DLQ topic (marked `poison`), which never had a ledger row."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.ledger import Selection
    from lapse.operator_actions import list_dead_letters, poison_records
    from lapse.shell.known_names import refuse_unknown

    engine = engine_from_settings(settings)
    try:
        with engine.connect() as conn:
            refuse_unknown(conn, settings, kind=kind, tenant=tenant)
            rows = [{"poison": False, **row} for row in list_dead_letters(conn, Selection(kind, tenant), limit)]
    finally:
        engine.dispose()
    if poison:
        rows += poison_records(settings, kind, tenant, limit)
    emit({"dead_letters": rows}, as_json, _list_text)


def confirm_or_refuse(question: str, yes: bool) -> None:
    """Go on when `--yes` was given or the operator confirms at a terminal; refuse in one line
    when there is no terminal to ask on, and stop when the operator says no."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CommandFailed(ExitCode.USAGE, f"{question} Not confirmed: no terminal to ask on; add --yes")
    if not click.confirm(question, default=False):
        raise CommandFailed(ExitCode.INTERRUPTED, "not confirmed: nothing changed")


def check_operator_input(verb: str, reason: str, actor: str, kind: str | None, tenant: str | None,
                         op_keys: tuple[str, ...], select_all: bool) -> None:
    """Refuse (a usage error) an action on dead letters without a reason, an actor, or a selection:
    --kind, --tenant, --op-key, or --all alone."""
    if not reason.strip():
        raise click.UsageError("--reason must say why")
    if not actor.strip():
        raise click.UsageError("--actor must name the operator")
    selected = bool(kind or tenant or op_keys)
    if not selected and not select_all:
        raise click.UsageError(f"say which dead letters to {verb}: --kind, --tenant or --op-key, or --all")
    if selected and select_all:
        raise click.UsageError("--all selects every dead letter: give it without --kind, --tenant, --op-key")


@dlq.command("replay")
@_selection_options
@_operator_options("replay", "released", "they are replayed")
@click.option("--include-replayed", is_flag=True,
              help="Also release dead letters that already failed after an earlier replay.")
@pass_settings
def dlq_replay(settings: Settings, kind: str | None, tenant: str | None, as_json: bool, limit: int,
               reason: str, op_keys: tuple[str, ...], actor: str, include_replayed: bool, select_all: bool,
               dry_run: bool, yes: bool) -> None:
    """Release a bounded selection of dead letters back to lapse.expiry under one replay id.

    Name the selection (--kind, --tenant, --op-key) or give --all; the count is shown and confirmed
    (--yes) before anything is released, and the replay is recorded as an operator action."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.ledger import Selection
    from lapse.operator_actions import preview, run_replay
    from lapse.shell.known_names import refuse_unknown

    check_operator_input("replay", reason, actor, kind, tenant, op_keys, select_all)
    selection = Selection(kind, tenant, tuple(op_keys), include_replayed)
    engine = engine_from_settings(settings)
    try:
        with engine.connect() as conn:
            refuse_unknown(conn, settings, kind=kind, tenant=tenant)
        found = preview(engine, selection, limit)
        if dry_run:
            emit({"dry_run": True, "selection": found["selection"], "limit": limit,
                  "would_release": found["matching"], "op_keys": found["op_keys"]}, as_json, lambda d: (
                f"dry run: would release {d['would_release']} dead letters ({d['selection']}, limit "
                f"{d['limit']}); nothing changed"))
            return
        done: dict[str, Any] = {"replay_id": None, "released": []}
        if found["op_keys"]:
            confirm_or_refuse(f"Release {found['matching']} dead letters ({found['selection']}, limit {limit}) to be "
                              "processed again?", yes)
            done = run_replay(engine, selection, limit=limit, actor=actor, reason=reason, shown=found["matching"],
                              expiry_topic=settings.topology.expiry)
    finally:
        engine.dispose()
    data: dict[str, Any] = {"replay_id": done["replay_id"], "released": done["released"], "actor": actor}
    emit(data, as_json, lambda d: (
        f"replay {d['replay_id']}: released {len(d['released'])} dead letters\n"
        + "\n".join(f"  {r['op_key']}" for r in d["released"])) if d["released"]
        else "nothing to replay: no dead letters match")


@dlq.command("discard")
@_selection_options
@_operator_options("discard", "discarded", "they will never be retried")
@pass_settings
def dlq_discard(settings: Settings, kind: str | None, tenant: str | None, as_json: bool, limit: int,
                reason: str, op_keys: tuple[str, ...], actor: str, select_all: bool, dry_run: bool,
                yes: bool) -> None:
    """Discard a bounded selection of dead letters: they will never be retried or replayed.

    Name the selection (--kind, --tenant, --op-key) or give --all; replayed dead letters are
    included. The count is shown and confirmed (--yes) before anything changes; each row's
    transition and an operator action record who and why. A late redelivery of a discarded
    operation's event is absorbed as a duplicate."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.operator_actions import discard_selection, preview, run_discard
    from lapse.shell.known_names import refuse_unknown

    check_operator_input("discard", reason, actor, kind, tenant, op_keys, select_all)
    selection = discard_selection(kind, tenant, op_keys)
    engine = engine_from_settings(settings)
    try:
        with engine.connect() as conn:
            refuse_unknown(conn, settings, kind=kind, tenant=tenant)
        found = preview(engine, selection, limit)
        if dry_run:
            emit({"dry_run": True, "selection": found["selection"], "would_discard": found["matching"],
                  "op_keys": found["op_keys"], "limit": limit}, as_json, lambda d: (
                f"dry run: would discard {d['would_discard']} dead letters ({d['selection']}, limit "
                f"{d['limit']}); nothing changed"))
            return
        done: dict[str, Any] = {"discarded": [], "action_id": None}
        if found["op_keys"]:
            confirm_or_refuse(f"Discard {found['matching']} dead letters ({found['selection']}, limit "
                              f"{limit}) for good? They will never be retried.", yes)
            done = run_discard(engine, selection, limit=limit, actor=actor, reason=reason,
                               shown=found["matching"])
    finally:
        engine.dispose()
    emit({**done, "actor": actor}, as_json, lambda d: (
        f"discarded {len(d['discarded'])} dead letters (operator action {d['action_id']})\n"
        + "\n".join(f"  {r['op_key']}" for r in d["discarded"])) if d["discarded"]
        else "nothing to discard: no dead letters match")
