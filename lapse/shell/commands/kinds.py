"""`lapse kinds list` and `lapse kinds check`: the cleanup kinds of the kinds file, as declared and
against the live database; and the one-line refusal every command gives for a wrong kinds file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.kernel.topology import TopicsFileError, Topology
from lapse.shell.cli import main
from lapse.shell.cli_options import F, emit, log_options, pass_settings, setting_option


@contextmanager
def kinds_file_errors() -> Iterator[None]:
    """Turn a wrong kinds file (KindsFileError) into a one-line ClickException, no traceback."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.kinds import KindsFileError

    try:
        yield
    except KindsFileError as exc:
        raise click.ClickException(str(exc)) from None


def _options(func: F) -> F:
    for opt in reversed([
        setting_option("kinds.file", "--kinds-file"),
        log_options,
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]):
        func = opt(func)
    return func


@main.group()
def kinds() -> None:
    """The cleanup kinds declared in the kinds file (kinds.file)."""


def _list_text(data: dict[str, Any]) -> str:
    lines = []
    for k in data["kinds"]:
        where = f"{k.get('table', '?')} due {k.get('due', '?')}"
        where += f" generation {k['generation']}" if k.get("generation") else ""
        conditions = " and ".join(k.get("conditions") or []) or "-"
        extra = f"  python {k['python']}" if "python" in k else ""
        lines.append(f"{k['name']:<24} {k['effect']:<13} {where}  when {conditions}{extra}")
    return "\n".join(lines) or f"no kinds in {data['file']}"


@kinds.command("list")
@_options
@pass_settings
def list_kinds(settings: Settings, as_json: bool) -> None:
    """Each kind as declared: name, table, effect, due column, conditions (no database needed)."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.kinds import describe, read_kinds_file

    with kinds_file_errors():
        kinds_file = read_kinds_file(settings.kinds.file)
    emit({"file": str(kinds_file.path), "kinds": describe(kinds_file)}, as_json, _list_text)


def _check_text(data: dict[str, Any]) -> str:
    lines = []
    for c in data["kinds"]:
        if c["ok"]:
            lines.append(f"ok      {c['name']} ({c['effect']} on {c['table']}, index {c['due_index']})")
        else:
            lines += [f"FAILED  {c['name']}: {problem}" for problem in c["problems"]]
    lines += [f"waiting {kind}: {n} operations held; the file does not declare the kind (declare it again to "
              "resume them)" for kind, n in data.get("undeclared", {}).items()]
    return "\n".join(lines) or f"no kinds in {data['file']}"


def topology_or_none(settings: Settings) -> Topology | None:
    """The topics file's topology, for the topics effects name; None when it cannot be read (a
    kind that names a topic then says so)."""
    try:
        return settings.topology
    except TopicsFileError:
        return None


def _undeclared_work(engine: Any, declared: frozenset[str]) -> dict[str, int]:
    """Held work of kinds the file does not declare; nothing when the role may not read Lapse's
    tables (a role that only checks business tables)."""
    # function-local: keeps `lapse --help` fast
    from sqlalchemy.exc import DBAPIError

    from lapse.kernel.clock import engine_now
    from lapse.readers import brakes_status

    try:
        with engine.connect() as conn:
            undeclared: dict[str, int] = brakes_status(conn, engine_now(engine), declared)["undeclared"]
            return undeclared
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == INSUFFICIENT_PRIVILEGE:
            return {}
        raise


INSUFFICIENT_PRIVILEGE = "42501"


@kinds.command("check")
@setting_option("database.url")
@_options
@pass_settings
def check(settings: Settings, as_json: bool) -> None:
    """Check every kind against the live database: columns exist with fitting types, the (due, id)
    index exists (else the CREATE INDEX to add), the role may change the table. Exit status 1
    when a check fails. Work held for kinds the file no longer declares is listed too."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import DatabaseNotConfigured, engine_from_settings
    from lapse.kernel.kinds import check_kinds, read_kinds_file

    with kinds_file_errors():
        kinds_file = read_kinds_file(settings.kinds.file)
    try:
        engine = engine_from_settings(settings)
    except DatabaseNotConfigured as exc:
        raise click.UsageError(str(exc)) from None
    try:
        checks = check_kinds(kinds_file, engine, settings.database.schema_name, topology_or_none(settings))
        undeclared = _undeclared_work(engine, frozenset(kinds_file.kinds))
    finally:
        engine.dispose()
    emit({"file": str(kinds_file.path), "kinds": [c.to_dict() for c in checks],
          "ok": all(c.ok for c in checks), "undeclared": undeclared}, as_json, _check_text)
    if not all(c.ok for c in checks):
        raise SystemExit(1)
