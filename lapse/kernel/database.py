"""Engines and migrations for Lapse's database (PostgreSQL in production, SQLite for the demo).

Lapse's own tables live in their own namespace: `lapse_`-prefixed names on both dialects and, on
PostgreSQL, the schema `database.schema_name`. The models name a placeholder schema; engines map it
to the effective one with SQLAlchemy's `schema_translate_map`. Migrations name the effective schema
explicitly (passed in the Alembic config's attributes), so offline SQL is right too.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, Table, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import NoSuchModuleError
from sqlalchemy.pool import ConnectionPoolEntry

from lapse.kernel import package_files
from lapse.kernel.connections import postgres_tls_args
from lapse.kernel.models import SCHEMA
from lapse.kernel.schema_names import DATABASE_SCHEMA
from lapse.kernel.settings import Settings, env_var

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.migration import MigrationContext

DEFAULT_SCHEMA = DATABASE_SCHEMA
TABLE_PREFIX = "lapse_"
# The time partitions of a partitioned table on PostgreSQL: lapse_outbox_p20261130, lapse_outbox_default.
PARTITION_NAME = re.compile(r"lapse_\w+_(p\d{8}|default)")
VERSION_TABLE = "lapse_alembic_version"
# The layout before the namespace: unprefixed tables and Alembic's default version table in the
# default schema. Only its last revision is upgraded in place.
LEGACY_VERSION_TABLE = "alembic_version"
LEGACY_LEDGER = "cleanup_ledger"
LEGACY_REVISIONS = ("0001", "0002", "0003")
LEGACY_HEAD = "0003"
# The defaults of `database.connect_timeout_s` and `database.statement_timeout_s`, for engines
# made from a URL alone.
CONNECT_TIMEOUT_S = 10.0
STATEMENT_TIMEOUT_S = 60.0


class DatabaseNotConfigured(ValueError):
    """No database URL was given: Lapse never falls back to a local file outside the demo."""


class UpgradeRefused(RuntimeError):
    """The database is in a state `lapse db upgrade` cannot move from; nothing was changed."""


def effective_schema(url: str, schema: str) -> str | None:
    """The schema Lapse's tables live in at `url`: `schema` on PostgreSQL, none on SQLite (whose
    one namespace per file is kept apart by the `lapse_` prefix alone)."""
    return None if make_url(url).get_backend_name() == "sqlite" else schema


def make_engine(url: str, *, schema: str = DEFAULT_SCHEMA, pool_size: int = 5,
                connect_timeout_s: float = CONNECT_TIMEOUT_S,
                statement_timeout_s: float | None = STATEMENT_TIMEOUT_S, pre_ping: bool = True,
                connect_args: Mapping[str, Any] | None = None) -> Engine:
    """An engine tuned per dialect (SQLite gets WAL, a busy timeout and immediate write locks) that
    maps the models' placeholder schema to Lapse's effective schema at `url`. On PostgreSQL a
    connection attempt gives up after `connect_timeout_s` and a statement after
    `statement_timeout_s` (None: no limit), so a database that accepts connections and never
    answers fails fast instead of hanging; a URL that sets either itself keeps its own. Without
    `pre_ping` a pooled connection is not tested (a round trip) before each use: for a caller that
    treats a dead connection's error as an outage and retries, such as the cleanup worker.
    Bound parameters are hidden from errors and logs (`hide_parameters`): they carry business
    identifiers and payloads, which a crash line or traceback must not print. `connect_args` are
    more libpq connection parameters (the TLS ones of `connect_args(settings)`)."""
    options = {"schema_translate_map": {SCHEMA: effective_schema(url, schema)}}
    parsed = make_url(url)
    try:
        parsed.get_dialect().import_dbapi()
    except ImportError as exc:  # a dialect SQLAlchemy knows whose driver is not installed: the URL is wrong here
        raise NoSuchModuleError(f"the database URL's driver {parsed.drivername} is not installed "
                                f"({exc}); use postgresql+psycopg://") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "isolation_level": None},
                               execution_options=options, hide_parameters=True)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # Take the write lock at BEGIN so two writers queue instead of deadlocking on upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=pre_ping,
                         execution_options=options, hide_parameters=True,
                         connect_args={**_timeouts(parsed.query, connect_timeout_s, statement_timeout_s),
                                       **(connect_args or {})})


def _timeouts(query: Mapping[str, Any], connect_timeout_s: float,
              statement_timeout_s: float | None) -> dict[str, Any]:
    """libpq's connect_timeout (whole seconds, at least 2 as libpq counts it), a session
    statement_timeout and custom plans only, unless the URL's query already sets them."""
    args: dict[str, Any] = {}
    if "connect_timeout" not in query:
        args["connect_timeout"] = max(2, math.ceil(connect_timeout_s))
    if "options" not in query:
        # Every statement planned with its own values, even once the server prepared it: a generic
        # plan made while a table was empty (a sequential scan) is never kept as the table grows
        # (PITFALLS.md). Lapse's statements are batch-shaped, so planning is a small part of each.
        options = ["-c plan_cache_mode=force_custom_plan"]
        if statement_timeout_s is not None:
            options.append(f"-c statement_timeout={max(1, round(statement_timeout_s * 1000))}")
        args["options"] = " ".join(options)
    return args


def configured_url(settings: Settings) -> str:
    """The database URL the user set; the implicit default (a local SQLite file) is refused, so a
    deployment never runs on, or migrates, a database nobody chose."""
    if "url" not in settings.database.model_fields_set:
        raise DatabaseNotConfigured(
            f"no database configured: set database.url ({env_var('database.url')}) or pass --database-url")
    return settings.database.url_plain()


def connect_args(settings: Settings) -> dict[str, Any]:
    """libpq's TLS parameters (sslmode, root and client certificates) of the configured database,
    mapped by lapse.kernel.connections; none for SQLite. Raises ConnectionRefused (one line) for a
    TLS setting that cannot be honoured, before anything connects."""
    url = configured_url(settings)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {}
    return postgres_tls_args(settings.database, parsed.query)


def engine_from_settings(settings: Settings, *, pool_size: int = 5, pre_ping: bool = True) -> Engine:
    """The engine of the configured database, with its schema, timeouts and TLS from `settings`."""
    db = settings.database
    return make_engine(configured_url(settings), schema=db.schema_name, pool_size=pool_size,
                       connect_timeout_s=db.connect_timeout_s, statement_timeout_s=db.statement_timeout_s,
                       pre_ping=pre_ping, connect_args=connect_args(settings))


def qualified_name(bind: Connection | Engine, table: Table) -> str:
    """The name of `table` for SQL text on `bind`: quoted as needed and qualified by the schema the
    bind's translate map gives it (`lapse.lapse_ledger`; `lapse_ledger` on SQLite)."""
    schema = table.schema
    translate = bind.get_execution_options().get("schema_translate_map") or {}
    if schema in translate:
        schema = translate[schema]
    preparer = bind.dialect.identifier_preparer
    name = preparer.quote(table.name)
    return f"{preparer.quote_schema(schema)}.{name}" if schema else name


def include_name(schema: str | None, default_schema: str | None = None,
                 ) -> Callable[[str | None, str, Mapping[str, Any]], bool]:
    """Alembic's name filter for comparing a database with the models: Lapse's schema alone (None
    names the connection's `default_schema`), and only Lapse's tables in it, the version table
    aside (on SQLite they share the file with everything else)."""

    def include(name: str | None, type_: str, _parents: Mapping[str, Any]) -> bool:
        if type_ == "schema":
            return name == schema or (name is None and default_schema == schema)
        if type_ == "table":  # a time partition is part of its table (lapse.kernel.ledger.partitions)
            return (name is not None and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE
                    and not PARTITION_NAME.fullmatch(name))
        return True

    return include


def masked(url: str) -> str:
    """`url` with its password hidden, to show which database a command works on."""
    return make_url(url).render_as_string(hide_password=True)


def alembic_config(url: str, schema: str = DEFAULT_SCHEMA) -> Config:
    """Alembic's configuration for Lapse's migrations at `url`; the migrations and env.py read the
    effective schema from `attributes["schema"]`."""
    from alembic.config import Config  # function-local: alembic is slow to import and only migrations need it

    cfg = Config(output_buffer=io.StringIO())
    cfg.set_main_option("script_location", str(package_files.migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["schema"] = effective_schema(url, schema)
    return cfg


def version_context(conn: Connection, schema: str | None) -> MigrationContext:
    """Alembic's view of Lapse's version table on `conn` (`schema` is the effective one)."""
    from alembic.migration import MigrationContext  # function-local: alembic is slow to import

    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE,
                                                  "version_table_schema": schema})


def legacy_revision(conn: Connection) -> str | None:
    """The revision of a database in the layout before the namespace (Lapse's unprefixed tables and
    Alembic's default version table in the default schema), or None. Another application's
    `alembic_version` alone is not Lapse's."""
    insp = inspect(conn)
    if not (insp.has_table(LEGACY_VERSION_TABLE) and insp.has_table(LEGACY_LEDGER)):
        return None
    found = conn.execute(text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}")).scalars().all()
    return next((rev for rev in LEGACY_REVISIONS if rev in found), None)


@dataclass(frozen=True)
class RevisionChange:
    """What `upgrade_url` did: the database (password masked), Lapse's schema there, the revision
    before (a legacy one for the previous layout) and after."""

    database: str
    schema: str | None
    before: str | None
    after: str | None
    legacy: bool

    def text(self) -> str:
        where = self.database + (f" (schema {self.schema})" if self.schema else "")
        if self.before == self.after:
            return f"{where}: {self.after} (already at head)"
        before = f"legacy {self.before}" if self.legacy else (self.before or "none")
        return f"{where}: {before} → {self.after}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def upgrade_url(url: str, revision: str = "head", *, schema: str = DEFAULT_SCHEMA,
                connect_timeout_s: float = CONNECT_TIMEOUT_S,
                connect_args: Mapping[str, Any] | None = None) -> RevisionChange:
    """Run the Alembic migrations up to `revision` on the database at `url`, with Lapse's tables in
    `schema` (PostgreSQL). A database in the previous layout at its last revision is moved in place;
    at an earlier one it is refused (UpgradeRefused) before anything changes."""
    from alembic import command  # function-local: alembic is slow to import and only migrations need it

    cfg = alembic_config(url, schema)
    effective = cfg.attributes["schema"]
    # No statement timeout: a migration may rightly run long on a big table.
    engine = make_engine(url, schema=schema, connect_timeout_s=connect_timeout_s, statement_timeout_s=None,
                         connect_args=connect_args)
    try:
        with engine.connect() as conn:
            before = version_context(conn, effective).get_current_revision()
            legacy = legacy_revision(conn) if before is None else None
            conn.commit()
            if legacy is not None and legacy != LEGACY_HEAD:
                raise UpgradeRefused(
                    f"{masked(url)} holds Lapse's tables at the old revision {legacy}: upgrade it to "
                    f"{LEGACY_HEAD} with the Lapse release that created it, then run `lapse db upgrade` again")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
            after = version_context(conn, effective).get_current_revision()
            conn.commit()
    finally:
        engine.dispose()
    return RevisionChange(masked(url), effective, legacy or before, after, legacy is not None)


def upgrade(settings: Settings, revision: str = "head") -> RevisionChange:
    return upgrade_url(configured_url(settings), revision, schema=settings.database.schema_name,
                       connect_timeout_s=settings.database.connect_timeout_s, connect_args=connect_args(settings))


def offline_sql(url: str, schema: str = DEFAULT_SCHEMA, revision: str = "head") -> str:
    """The SQL that installs Lapse's tables up to `revision` on an empty database of `url`'s
    dialect, for review (Alembic's offline mode; nothing connects)."""
    from alembic import command  # function-local: alembic is slow to import and only migrations need it

    cfg = alembic_config(url, schema)
    command.upgrade(cfg, revision, sql=True)
    buffer = cfg.output_buffer
    assert isinstance(buffer, io.StringIO)
    return buffer.getvalue()


def history(url: str, schema: str = DEFAULT_SCHEMA) -> list[dict[str, Any]]:
    """Lapse's migrations, newest first (Alembic's script directory), each with its revision, the
    one it revises, whether it is the head, and its summary line."""
    from alembic.script import ScriptDirectory  # function-local: alembic is slow to import

    scripts = ScriptDirectory.from_config(alembic_config(url, schema))
    return [{"revision": s.revision, "down_revision": s.down_revision, "head": s.is_head,
             "summary": " ".join((s.doc or "").split())}
            for s in scripts.walk_revisions()]


def current(url: str, schema: str = DEFAULT_SCHEMA, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
            statement_timeout_s: float = STATEMENT_TIMEOUT_S,
            connect_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The database's revision of Lapse's tables against the head of the migrations; a database
    in the previous layout shows its legacy revision."""
    from alembic.script import ScriptDirectory  # function-local: alembic is slow to import

    cfg = alembic_config(url, schema)
    effective = cfg.attributes["schema"]
    head = ScriptDirectory.from_config(cfg).get_current_head()
    engine = make_engine(url, schema=schema, connect_timeout_s=connect_timeout_s,
                         statement_timeout_s=statement_timeout_s, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            revision = version_context(conn, effective).get_current_revision()
            legacy = legacy_revision(conn) if revision is None else None
    finally:
        engine.dispose()
    return {"database": masked(url), "schema": effective, "revision": revision, "legacy_revision": legacy,
            "head": head, "at_head": revision == head}
