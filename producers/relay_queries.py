"""SQL of the outbox relay: take the oldest unsent rows under a lock, mark them sent."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from lapse.kernel.batch_sql import any_of
from lapse.kernel.models import outbox


def lock_unsent(conn: Connection, limit: int) -> list[Any]:
    """The oldest unsent rows, locked (FOR UPDATE on PostgreSQL; SQLite's write lock serialises),
    so a second relay waits instead of publishing the same rows out of order."""
    stmt = (
        select(outbox.c.id, outbox.c.topic, outbox.c.key, outbox.c.schema, outbox.c.payload,
               outbox.c.headers)
        .where(outbox.c.sent_at.is_(None))
        .order_by(outbox.c.id)
        .limit(limit)
        .with_for_update()
    )
    return list(conn.execute(stmt).all())


def mark_sent(conn: Connection, ids: list[int], now: datetime) -> None:
    """Mark the published rows sent: their ids as one array parameter, so the statement's text is
    the same for every batch (an IN list of one placeholder per row was parsed again each time)."""
    conn.execute(update(outbox).where(any_of(conn, outbox.c.id, ids)).values(sent_at=now))
