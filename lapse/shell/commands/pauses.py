"""`lapse pause KIND` and `lapse resume KIND`: the operator's brake on a kind, or on one tenant of
it. A pause is honoured by every role within seconds (no effect of it runs; its work waits, held,
never lost or charged an attempt); a resume releases what waited (docs/design/brakes.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import F, emit, pass_settings, setting_option
from lapse.shell.commands.kinds import kinds_file_errors, topology_or_none
from lapse.shell.error_boundary import CommandFailed, ExitCode

SHOWN_KINDS = 20


def _options(verb: str) -> Any:
    def decorate(func: F) -> F:
        for opt in reversed([
            click.argument("kind"),
            click.option("--tenant", default=None, help=f"{verb.capitalize()} only this tenant of the kind."),
            click.option("--reason", required=True, help=f"Why the kind is {verb}d, kept in the audit trail."),
            click.option("--actor", envvar="USER", show_envvar=True, required=True,
                         help=f"Operator name recorded with the {verb}."),
            setting_option("database.url"),
            setting_option("kinds.file", "--kinds-file"),
            setting_option("runtime.log_level"),
            click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
        ]):
            func = opt(func)
        return func
    return decorate


def _check_words(reason: str, actor: str, tenant: str | None) -> None:
    if not reason.strip():
        raise click.UsageError("--reason must say why")
    if not actor.strip():
        raise click.UsageError("--actor must name the operator")
    if tenant is not None and not 0 < len(tenant) <= 64:
        raise click.UsageError("--tenant must be 1 to 64 characters")


@main.command("pause")
@_options("pause")
@click.option("--new-tenant", is_flag=True,
              help="Pause a tenant no business row has yet (one about to arrive).")
@pass_settings
def pause(settings: Settings, kind: str, tenant: str | None, reason: str, actor: str, as_json: bool,
          new_tenant: bool) -> None:
    """Pause KIND (or one --tenant of it): within seconds no effect of it runs anywhere; its events
    are still consumed and its work waits, held, until `lapse resume`. A kind or tenant already
    paused is left as it is."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.kinds import KindsFile, compile_kinds, read_kinds_file
    from lapse.kernel.kinds.errors import show
    from lapse.operator_actions import run_pause, tenant_seen

    _check_words(reason, actor, tenant)
    with kinds_file_errors():
        kinds_file = read_kinds_file(settings.kinds.file)
    if kind not in kinds_file.kinds:
        names = list(kinds_file.kinds)
        known = ", ".join(names[:SHOWN_KINDS]) + (", …" if len(names) > SHOWN_KINDS else "")
        raise CommandFailed(ExitCode.USAGE, f"pause: no kind {show(kind)} in {kinds_file.path} "
                                            f"(its kinds: {known or 'none'})")
    engine = engine_from_settings(settings)
    try:
        if tenant is not None:
            with kinds_file_errors():
                compiled = compile_kinds(KindsFile(kinds_file.path, {kind: kinds_file.kinds[kind]}), engine,
                                         settings.database.schema_name, topology_or_none(settings))[kind]
            if not compiled.has_tenant:
                raise CommandFailed(ExitCode.USAGE, f"pause: kind {show(kind)} has no tenant column; pause the "
                                                    "whole kind")
            if not new_tenant and tenant_seen(engine, compiled, tenant) is False:
                raise CommandFailed(ExitCode.USAGE, f"pause: no row of {compiled.table.name} has tenant "
                                                    f"{show(tenant)}; add --new-tenant to pause it anyway")
        done = run_pause(engine, kind, tenant, reason=reason, actor=actor, via="cli")
    finally:
        engine.dispose()
    emit(done, as_json, _pause_text)


def _pause_text(d: dict[str, Any]) -> str:
    p = d["pause"]
    target = p["kind"] + (f"/{p['tenant']}" if p["tenant"] else "")
    if d["paused"]:
        return f"paused {target} (operator action {d['action_id']}): its effects stop within seconds"
    return (f"{target} was already paused since {p['since']} by {p['actor']} ({p['cause']}: {p['reason']}); "
            "nothing changed")


@main.command("resume")
@_options("resume")
@pass_settings
def resume(settings: Settings, kind: str, tenant: str | None, reason: str, actor: str, as_json: bool) -> None:
    """Resume KIND (or one --tenant of it): the pause is lifted (a spent budget starts a new window)
    and the work it held is released, each operation once, attempts unchanged."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.kinds import compile_kinds, read_kinds_file
    from lapse.kernel.kinds.errors import show
    from lapse.operator_actions import run_resume

    _check_words(reason, actor, tenant)
    with kinds_file_errors():
        kinds_file = read_kinds_file(settings.kinds.file)
    engine = engine_from_settings(settings)
    try:
        with kinds_file_errors():
            compiled = compile_kinds(kinds_file, engine, settings.database.schema_name, topology_or_none(settings))
        with _progress() as progress:
            done = run_resume(engine, compiled, settings.topology, kind, tenant, reason=reason, actor=actor,
                              via="cli", progress=progress)
    finally:
        engine.dispose()
    if not done["resumed"]:
        target = kind + (f"/{tenant}" if tenant else "")
        raise CommandFailed(ExitCode.USAGE, f"resume: {show(target)} is not paused; nothing changed")
    emit(done, as_json, lambda d: (f"resumed {d['pause']['kind']}"
                                   + (f"/{d['pause']['tenant']}" if d["pause"]["tenant"] else "")
                                   + f" (operator action {d['action_id']}): {d['released']} held operations released"))


@contextmanager
def _progress() -> Iterator[Callable[[int], None] | None]:
    """A count of released operations on a terminal (stderr); nothing otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=0, label="releasing held operations", file=sys.stderr, show_pos=True) as bar:
        yield bar.update
