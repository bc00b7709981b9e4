"""Fresh PostgreSQL databases for a bench run: one migrated, seeded template, cloned per stage.

Cloning with `CREATE DATABASE … TEMPLATE` gives every stage the same reservations and an empty
ledger in well under a second; every database made here is dropped by `close()`.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url

from lapse.devtools.demo_tables import create_demo_tables
from lapse.kernel.database import make_engine, upgrade_url

DEFAULT_ADMIN_URL = "postgresql+psycopg://lapse@127.0.0.1:5432/lapse"


def drop_database(conn: Connection, name: str) -> None:
    """Drop the database `name` on the server of `conn` (autocommit): the sessions there that
    `conn`'s role may end are ended first, then a plain DROP, which stops autovacuum workers itself
    and waits a few seconds for the ended sessions. Not WITH (FORCE): ending an autovacuum worker
    that way takes membership in pg_signal_backend, which the development role does not have."""
    conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name "
                      "AND pid <> pg_backend_pid() AND pg_has_role(usename, 'USAGE')"), {"name": name})
    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


def admin_url_for(database_url: str) -> str:
    """The configured URL when it is PostgreSQL, else the default local PostgreSQL."""
    return database_url if make_url(database_url).get_backend_name() == "postgresql" else DEFAULT_ADMIN_URL


class BenchDatabases:
    """Creates the run's template and its clones on the server of `admin_url`; drops them all."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.run_id = uuid.uuid4().hex[:8]
        self.template: str | None = None
        self.created: list[str] = []
        self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")

    def url(self, name: str) -> str:
        return make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)

    def create(self, stage: str, template: str | None = None) -> str:
        """A new database named for the run and stage (a clone of `template` if given); its URL."""
        name = f"lapse_bench_{self.run_id}_{stage}"
        clause = f' TEMPLATE "{template}"' if template else ""
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{clause}'))
        self.created.append(name)
        return self.url(name)

    def make_template(self, reservations: int, expires_at: datetime) -> None:
        """Create the demo's tables in a template, migrate it, and fill it with `reservations` held
        holds (ids 1..n) past expiry."""
        url = self.create("tpl")
        self.template = self.created[-1]
        engine = make_engine(url)
        try:
            create_demo_tables(engine)  # before Lapse's schema exists: see lapse.devtools.demo.prepare
            upgrade_url(url)
            seed_held(engine, reservations, expires_at)
        finally:
            engine.dispose()

    def clone(self, stage: str) -> str:
        """A fresh copy of the template for one stage: same reservations, empty ledger."""
        assert self.template is not None, "make_template first"
        return self.create(stage, self.template)

    def drop(self, url: str) -> None:
        name = make_url(url).database or ""
        with self._admin.connect() as conn:
            drop_database(conn, name)
        if name in self.created:
            self.created.remove(name)

    def close(self) -> None:
        with self._admin.connect() as conn:
            for name in reversed(self.created):
                drop_database(conn, name)
        self.created.clear()
        self._admin.dispose()


def seed_held(engine: Engine, count: int, expires_at: datetime, first_id: int = 1) -> None:
    """Insert held reservations with ids first_id..first_id+count-1 in one server-side statement."""
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO reservations (id, tenant, status, expires_at) "
            "SELECT i, 'tenant-' || (i % 7), 'held', :expires"
            " FROM generate_series(CAST(:a AS bigint), CAST(:b AS bigint)) AS i"
        ), {"expires": expires_at, "a": first_id, "b": first_id + count - 1})
        conn.execute(text("SELECT setval(pg_get_serial_sequence('reservations', 'id'), :b)"),
                     {"b": first_id + count - 1})
        conn.execute(text("ANALYZE reservations"))
