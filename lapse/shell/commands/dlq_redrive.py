"""`lapse dlq redrive`: decode poison dead letters again with the current schemas and kinds, and
send what now decodes to the expiry topic under a redrive id (lapse.operator_actions.redrive).

The selection is DLQ positions (`--offset P:O`, repeatable, as `lapse dlq list` shows them), a
reason code (`--reason-code`), or `--all`; one of them. The count is shown and confirmed (`--yes`)
before anything is sent; `--dry-run` only decodes and counts. A selection that matches no poison
dead letter is refused in one line (exit 2).
"""

from __future__ import annotations

import re
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.shell.cli_options import connection_options, emit, pass_settings, setting_option
from lapse.shell.commands.dlq import confirm_or_refuse, dlq
from lapse.shell.error_boundary import CommandFailed, ExitCode

_POSITION = re.compile(r"([0-9]{1,10}):([0-9]{1,19})")
_REASON_CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_PARTITION, MAX_OFFSET = 2**31 - 1, 2**63 - 1


def _shown(text: str) -> str:
    """An operator's text as a refusal quotes it: its start, escaped, at most 60 characters."""
    return one_line(repr(text[:40]), 60)


def dlq_position(text: str) -> tuple[int, int]:
    """A DLQ position `PARTITION:OFFSET` (`lapse dlq list` shows `dlq P@O`; `P@O` is taken too);
    ValueError naming what is wrong."""
    match = _POSITION.fullmatch(text.strip().replace("@", ":", 1))
    if match is None:
        raise ValueError(f"{_shown(text)} is not PARTITION:OFFSET (two whole numbers, e.g. 0:17)")
    partition, offset = int(match[1]), int(match[2])
    if partition > MAX_PARTITION or offset > MAX_OFFSET:
        raise ValueError(f"{_shown(text)} is out of range for a Kafka partition and offset")
    return partition, offset


def _positions(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    try:
        return tuple(sorted({dlq_position(v) for v in values}))
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _reason_code(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _REASON_CODE.fullmatch(value):
        raise click.BadParameter(f"{_shown(value)} is not a reason code (letters, digits, _ . -; e.g. "
                                 "unknown_fingerprint)", ctx, param)
    return value


def _headline(data: dict[str, Any]) -> str:
    matching, selection = data["matching"], data["selection"]
    if data.get("dry_run"):
        return (f"dry run: would send {len(data['sendable'])} of {matching} matching poison dead letters "
                f"({selection}, limit {data['limit']}); nothing changed")
    if data["redrive_id"]:
        return f"redrive {data['redrive_id']}: sent {len(data['sent'])} of {matching} matching poison dead letters"
    return f"nothing sent: none of the {matching} poison dead letters matching {selection} can be sent now"


def _text(data: dict[str, Any]) -> str:
    lines = [_headline(data)]
    for label, entries in (("sent", data.get("sent", data.get("sendable", []))), ("fails", data["fails"]),
                           ("skipped", data["skipped"])):
        for e in entries:
            why = f"{e['code']}: {e['reason']}" if "code" in e else e.get("skipped", "")
            parts = (f"{label:<7}", f"dlq {e['dlq']}", e.get("op_key"), why)
            lines.append(("  " + "  ".join(p for p in parts if p))[:220])
    return "\n".join(lines)


@dlq.command("redrive")
@connection_options
@setting_option("schemas.dir", "--schemas-dir")
@click.option("--limit", type=click.IntRange(1, 10_000), required=True,
              help="Most poison dead letters decoded (and sent) by this redrive (required).")
@click.option("--reason", required=True, help="Why they are redriven (the fix), kept in the audit trail.")
@click.option("--actor", envvar="USER", show_envvar=True, required=True,
              help="Operator name recorded with the redrive.")
@click.option("--offset", "offsets", multiple=True, callback=_positions, metavar="P:O",
              help="Only the dead letter at this DLQ partition:offset (repeatable; `dlq list` shows them).")
@click.option("--reason-code", callback=_reason_code, default=None,
              help="Only poison of this reason code (unknown_fingerprint, unknown_kind, …).")
@click.option("--all", "select_all", is_flag=True, help="Every poison dead letter.")
@click.option("--dry-run", is_flag=True, help="Only decode and count what would be sent; change nothing.")
@click.option("--yes", is_flag=True, help="Redrive without asking (for scripts).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_settings
def dlq_redrive(settings: Settings, limit: int, reason: str, actor: str, offsets: tuple[tuple[int, int], ...],
                reason_code: str | None, select_all: bool, dry_run: bool, yes: bool, as_json: bool) -> None:
    """Decode poison dead letters again with the current schemas and send what now decodes to the
    expiry topic under one redrive id, recorded as an operator action.

    Name the selection (--offset, --reason-code) or give --all. What still fails stays on the DLQ
    and is shown with its new reason; a dead letter sent once is never sent again."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.operator_actions import PoisonSelector, plan_redrive, run_redrive

    if not reason.strip():
        raise click.UsageError("--reason must say why")
    if not actor.strip():
        raise click.UsageError("--actor must name the operator")
    if sum((bool(offsets), reason_code is not None, select_all)) != 1:
        raise click.UsageError("say which poison to redrive: one of --offset (repeatable), --reason-code, --all")
    selector = PoisonSelector(offsets, reason_code, select_all)
    engine = engine_from_settings(settings)
    try:
        plan = plan_redrive(engine, settings, selector, limit)
        if plan.matching == 0:
            raise CommandFailed(ExitCode.USAGE, f"no poison dead letter on {settings.topology.dlq} matches "
                                                f"{plan.selection}: `lapse dlq list` lists them")
        if dry_run:
            emit({"dry_run": True, **plan.to_dict()}, as_json, _text)
            return
        done: dict[str, Any] = {"redrive_id": None, "selection": plan.selection, "matching": plan.matching,
                                "sent": [], "fails": plan.to_dict()["fails"], "skipped": plan.to_dict()["skipped"],
                                "action_id": None}
        if plan.sendable:
            confirm_or_refuse(f"Send {len(plan.sendable)} poison dead letters ({plan.selection}, limit {limit}) "
                              "to the expiry topic again?", yes)
            done = run_redrive(engine, plan, reason=reason, actor=actor, expiry_topic=settings.topology.expiry,
                               shown=len(plan.sendable))
    finally:
        engine.dispose()
    emit({**done, "actor": actor}, as_json, _text)
