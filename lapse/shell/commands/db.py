"""`lapse db`: Lapse's own tables in the configured database (upgrade, offline SQL, current, history)."""

from __future__ import annotations

from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, pass_settings, setting_option


def _database_options(func: Any) -> Any:
    """The database URL and Lapse's schema in it: all the `db` commands read."""
    for path in reversed(["database.url", "database.schema_name", "runtime.log_level"]):
        func = setting_option(path)(func)
    return func


def _configured_url(settings: Settings) -> str:
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import DatabaseNotConfigured, configured_url

    try:
        return configured_url(settings)
    except DatabaseNotConfigured as exc:
        raise click.ClickException(str(exc)) from None


def _failure(url: str, exc: Exception) -> click.ClickException:
    """A database error as one line: which database, and the driver's first line."""
    from lapse.kernel.database import masked  # function-local: keeps `lapse --help` fast

    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return click.ClickException(f"{masked(url)}: {first}")


@main.group()
def db() -> None:
    """Lapse's own tables: migrate them, show the SQL, their revision and the migrations."""


@db.command("upgrade")
@_database_options
@click.option("--sql", "offline", is_flag=True,
              help="Print the SQL of a fresh install for review instead of connecting.")
@click.option("--json", "as_json", is_flag=True, help="Print the revision change as one JSON object.")
@pass_settings
def db_upgrade(settings: Settings, offline: bool, as_json: bool) -> None:
    """Create or upgrade Lapse's tables (their own schema on PostgreSQL, `lapse_` tables on SQLite);
    a database in the previous layout is moved in place. Business tables are never touched."""
    # function-local: keeps `lapse --help` fast
    from sqlalchemy.exc import SQLAlchemyError

    from lapse.kernel.database import UpgradeRefused, connect_args, offline_sql, upgrade_url

    url = _configured_url(settings)
    schema = settings.database.schema_name
    if offline:
        click.echo(offline_sql(url, schema), nl=False)
        return
    try:
        change = upgrade_url(url, schema=schema, connect_timeout_s=settings.database.connect_timeout_s,
                             connect_args=connect_args(settings))
    except UpgradeRefused as exc:
        raise click.ClickException(str(exc)) from None
    except SQLAlchemyError as exc:
        raise _failure(url, exc) from None
    emit(change.to_dict(), as_json, lambda _: change.text())


@db.command("current")
@_database_options
@click.option("--json", "as_json", is_flag=True, help="Print the revision as one JSON object.")
@pass_settings
def db_current(settings: Settings, as_json: bool) -> None:
    """The revision of Lapse's tables in the database, and the head of the migrations."""
    # function-local: keeps `lapse --help` fast
    from sqlalchemy.exc import SQLAlchemyError

    from lapse.kernel.database import connect_args, current

    url = _configured_url(settings)
    try:
        data = current(url, settings.database.schema_name, connect_timeout_s=settings.database.connect_timeout_s,
                       statement_timeout_s=settings.database.statement_timeout_s,
                       connect_args=connect_args(settings))
    except SQLAlchemyError as exc:
        raise _failure(url, exc) from None
    emit(data, as_json, _current_text)


def _current_text(d: dict[str, Any]) -> str:
    where = d["database"] + (f" (schema {d['schema']})" if d["schema"] else "")
    if d["legacy_revision"]:
        state = f"legacy {d['legacy_revision']} (previous layout; `lapse db upgrade` moves it to {d['head']})"
    elif d["revision"] is None:
        state = f"none (no Lapse tables; head is {d['head']})"
    else:
        state = f"{d['revision']}" + (" (head)" if d["at_head"] else f" (head is {d['head']})")
    return f"{where}: {state}"


@db.command("history")
@_database_options
@click.option("--json", "as_json", is_flag=True, help="Print the migrations as a JSON list.")
@pass_settings
def db_history(settings: Settings, as_json: bool) -> None:
    """Lapse's migrations, newest first (reads no database)."""
    from lapse.kernel.database import history  # function-local: keeps `lapse --help` fast

    url = settings.database.url_plain()  # only the dialect matters here; the default will do
    emit(history(url, settings.database.schema_name), as_json,
         lambda rows: "\n".join(f"{r['down_revision'] or '<base>'} -> {r['revision']}"
                                f"{' (head)' if r['head'] else ''}, {r['summary']}" for r in rows))
