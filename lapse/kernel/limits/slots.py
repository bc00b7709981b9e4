"""A route's concurrency slots: rows leased to a worker until a time of the database's clock.
A worker takes free or expired slots (`FOR UPDATE SKIP LOCKED`, so two workers never wait on each
other), renews them while its calls run and gives them back when it is done; a worker that dies
leaves them to expire at the end of their lease.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection, or_, select, update

from lapse.kernel.clock import database_clock
from lapse.kernel.limits.routes import RouteKey
from lapse.kernel.models import limit_slots as S


def _of(key: RouteKey):  # type: ignore[no-untyped-def]
    return (S.c.kind == key.kind, S.c.route == key.route)


def acquire_slots(conn: Connection, key: RouteKey, holder: str, want: int, concurrency: int,
                  lease_s: float) -> list[int]:
    """Lease up to `want` of the route's first `concurrency` slots that are free or whose lease
    has run out to `holder`, until the database's now plus `lease_s`; the slots taken."""
    now = database_clock(conn)
    free = (select(S.c.slot).where(*_of(key), S.c.slot < concurrency,
                                   or_(S.c.holder.is_(None), S.c.until <= now))
            .order_by(S.c.slot).limit(want).with_for_update(skip_locked=True))
    slots = list(conn.execute(free).scalars())
    if slots:
        conn.execute(update(S).where(*_of(key), S.c.slot.in_(slots))
                     .values(holder=holder, until=now + timedelta(seconds=lease_s)))
    return slots


def renew_slots(conn: Connection, key: RouteKey, holder: str, slots: list[int], lease_s: float) -> set[int]:
    """Extend the lease of `holder`'s `slots` to now plus `lease_s`; the ones still its own."""
    if not slots:
        return set()
    until = database_clock(conn) + timedelta(seconds=lease_s)
    return set(conn.execute(update(S).where(*_of(key), S.c.slot.in_(slots), S.c.holder == holder)
                            .values(until=until).returning(S.c.slot)).scalars())


def release_slots(conn: Connection, key: RouteKey, holder: str, slots: list[int]) -> None:
    """Give `holder`'s `slots` back (one it lost to an expired lease is left to its new holder)."""
    if slots:
        conn.execute(update(S).where(*_of(key), S.c.slot.in_(slots), S.c.holder == holder)
                     .values(holder=None, until=None))
