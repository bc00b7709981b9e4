"""The demo's business tables: reservations held until they expire, artifacts retained until a date.

They belong to the demo and the tests, never to `lapse db upgrade`: Lapse cleans up tables it
does not own, and a user's database gets only Lapse's own tables.
"""

from __future__ import annotations

from sqlalchemy import Column, Engine, Index, MetaData, String, Table, text

from lapse.kernel.models import Id, UTCDateTime

demo_metadata = MetaData()

reservations = Table(
    "reservations",
    demo_metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("status", String(16), nullable=False),  # held | paid | cancelled | released
    Column("expires_at", UTCDateTime(), nullable=False),
    Column("released_at", UTCDateTime()),
    Index("ix_reservations_held_due", "expires_at", "id", postgresql_where=text("status = 'held'"),
          sqlite_where=text("status = 'held'")),
    Index("ix_reservations_held_tenant_due", "tenant", "expires_at", "id", postgresql_where=text("status = 'held'"),
          sqlite_where=text("status = 'held'")),
)

artifacts = Table(
    "artifacts",
    demo_metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("tenant", String(64), nullable=False),
    Column("object_key", String(512), nullable=False),
    Column("status", String(16), nullable=False),  # live | deleted
    Column("retain_until", UTCDateTime(), nullable=False),
    Column("deleted_at", UTCDateTime()),
    Index("ix_artifacts_live_due", "retain_until", "id", postgresql_where=text("status = 'live'"),
          sqlite_where=text("status = 'live'")),
    Index("ix_artifacts_live_tenant_due", "tenant", "retain_until", "id", postgresql_where=text("status = 'live'"),
          sqlite_where=text("status = 'live'")),
)


def create_demo_tables(engine: Engine) -> None:
    """Create the demo's tables (and their due-time and tenant indexes) where they do not exist yet."""
    with engine.begin() as conn:
        demo_metadata.create_all(conn, checkfirst=True)
