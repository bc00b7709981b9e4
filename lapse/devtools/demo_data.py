"""Demo and test data: reservations in every state, inserted in bulk."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, insert, select

from lapse.devtools.demo_tables import artifacts, reservations
from lapse.processors import FilesystemObjectStore


@dataclass(frozen=True)
class SeedMix:
    """How many reservations of each sort `seed_mix` makes."""

    expired_held: int
    future_held: int
    paid: int
    cancelled: int


def mix_for(total: int) -> SeedMix:
    """The demo's mix: most holds expired, some not yet due, some paid or cancelled in time."""
    expired = int(total * 0.7)
    future = int(total * 0.1)
    paid = int(total * 0.1)
    return SeedMix(expired, future, paid, total - expired - future - paid)


def add_reservations(
    conn: Connection, count: int, *, status: str = "held", expires_at: datetime,
    tenant: str | None = None, chunk: int = 5000,
) -> list[int]:
    """Insert `count` reservations; returns their ids in insertion order."""
    first = conn.execute(select(reservations.c.id).order_by(reservations.c.id.desc()).limit(1)).scalar()
    rows = [
        {"tenant": tenant or f"tenant-{i % 7}", "status": status, "expires_at": expires_at}
        for i in range(count)
    ]
    for start in range(0, count, chunk):
        conn.execute(insert(reservations), rows[start:start + chunk])
    ids = conn.execute(
        select(reservations.c.id).where(reservations.c.id > (first or 0)).order_by(reservations.c.id)
    ).scalars().all()
    return list(ids)


def seed_mix(conn: Connection, mix: SeedMix, now: datetime, rng: random.Random | None = None
             ) -> dict[str, list[int]]:
    """Seed the demo's reservations; returns the ids of each sort."""
    rng = rng or random.Random(7)
    past = now - timedelta(minutes=rng.randint(1, 30))
    return {
        "expired_held": add_reservations(conn, mix.expired_held, expires_at=past),
        "future_held": add_reservations(conn, mix.future_held, expires_at=now + timedelta(hours=1)),
        "paid": add_reservations(conn, mix.paid, status="paid", expires_at=past),
        "cancelled": add_reservations(conn, mix.cancelled, status="cancelled", expires_at=past),
    }


def add_artifacts(conn: Connection, count: int, *, retain_until: datetime, store: FilesystemObjectStore,
                  tenant: str | None = None) -> list[int]:
    """Insert `count` live artifacts and put their objects in `store`; returns their ids."""
    first = conn.execute(select(artifacts.c.id).order_by(artifacts.c.id.desc()).limit(1)).scalar() or 0
    rows: list[dict[str, Any]] = [{"tenant": tenant or f"tenant-{i % 7}", "object_key": f"exports/{first + i + 1}.csv",
             "status": "live", "retain_until": retain_until} for i in range(count)]
    if rows:
        conn.execute(insert(artifacts), rows)
    for row in rows:
        store.put(row["object_key"], b"lapse demo export")
    return list(conn.execute(select(artifacts.c.id).where(artifacts.c.id > first)
                             .order_by(artifacts.c.id)).scalars())
