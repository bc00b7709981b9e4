"""Engines and migrations for the ledger database (PostgreSQL in production, SQLite for the demo)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry

from lapse.kernel.settings import Settings

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """An engine tuned per dialect: SQLite gets WAL, a busy timeout and immediate write locks."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "isolation_level": None})

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
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def engine_from_settings(settings: Settings, *, pool_size: int = 5) -> Engine:
    return make_engine(settings.database.url_plain(), pool_size=pool_size)


def alembic_config(url: str) -> Config:
    from alembic.config import Config  # function-local: alembic is slow to import and only migrations need it

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_url(url: str, revision: str = "head") -> None:
    """Run the Alembic migrations up to `revision` on the database at `url`."""
    from alembic import command  # function-local: alembic is slow to import and only migrations need it

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
    finally:
        engine.dispose()


def upgrade(settings: Settings, revision: str = "head") -> None:
    upgrade_url(settings.database.url_plain(), revision)
