"""`lapse dlq list` and `lapse dlq replay`: dead letters are released only by an operator."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import F, emit, pass_settings, setting_option


def _selection_options(func: F) -> F:
    for opt in reversed([
        setting_option("database.url"),
        setting_option("runtime.log_level"),
        click.option("--kind", default=None, help="Only this cleanup kind."),
        click.option("--tenant", default=None, help="Only this tenant."),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]):
        func = opt(func)
    return func


@main.group()
def dlq() -> None:
    """Inspect and replay dead letters (never replayed automatically)."""


@dlq.command("list")
@_selection_options
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@pass_settings
def dlq_list(settings: Settings, kind: str | None, tenant: str | None, as_json: bool, limit: int) -> None:
    """Dead-lettered operations, oldest first, with their last failure."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.ledger import Selection
    from lapse.processors import list_dead_letters

    engine = engine_from_settings(settings)
    try:
        with engine.connect() as conn:
            rows = list_dead_letters(conn, Selection(kind, tenant), limit)
    finally:
        engine.dispose()
    emit({"dead_letters": rows}, as_json, lambda d: "\n".join(
        [f"{r['op_key']}  {r['tenant']}  attempt={r['attempt']}  {r['last_failure_class']}: "
         f"{(r['last_failure'] or '')[:100]}" + (f"  (replayed {r['replay_id']})" if r["replay_id"] else "")
         for r in d["dead_letters"]] or ["no dead letters"]))


@dlq.command("replay")
@_selection_options
@click.option("--limit", type=click.IntRange(1, 10_000), required=True,
              help="Most dead letters to release in this replay (required).")
@click.option("--reason", required=True, help="Why they are replayed, kept in the audit trail.")
@click.option("--op-key", "op_keys", multiple=True, help="Only these op keys (repeatable).")
@click.option("--actor", envvar="USER", show_envvar=True, required=True,
              help="Operator name recorded with the replay.")
@click.option("--include-replayed", is_flag=True,
              help="Also release dead letters that already failed after an earlier replay.")
@pass_settings
def dlq_replay(settings: Settings, kind: str | None, tenant: str | None, as_json: bool, limit: int,
               reason: str, op_keys: tuple[str, ...], actor: str, include_replayed: bool) -> None:
    """Release a bounded selection of dead letters back to lapse.expiry under one replay id."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.ledger import Selection
    from lapse.processors import replay

    if not reason.strip():
        raise click.UsageError("--reason must say why")
    engine = engine_from_settings(settings)
    try:
        with engine.begin() as conn:
            replay_id, released = replay(
                conn, Selection(kind, tenant, tuple(op_keys), include_replayed), limit=limit,
                reason=reason, actor=actor, now=datetime.now(UTC), expiry_topic=settings.topology.expiry)
    finally:
        engine.dispose()
    data: dict[str, Any] = {"replay_id": replay_id if released else None, "released": released, "actor": actor}
    emit(data, as_json, lambda d: (
        f"replay {d['replay_id']}: released {len(d['released'])} dead letters\n"
        + "\n".join(f"  {r['op_key']}" for r in d["released"])) if d["released"]
        else "nothing to replay: no dead letters match")
