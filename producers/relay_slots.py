"""Leased hash slots: several outbox relays in parallel on PostgreSQL, each key's rows in id order.

Every outbox key hashes into one of `SLOTS` slots (`relay_queries.slot_of_key`). A relay publishes
only the rows of the slots it holds, in id order, so all rows of one key are published by one relay
in id order. A relay holds a slot as a session advisory lock on one dedicated connection, the one
its batches run on: a lease cannot outlive the session that publishes under it. A stopped relay
unlocks everything; a dead one loses its session and, with it, its locks.

Each relay also holds a member lock keyed by its backend pid, so relays count one another in
`pg_locks`. Every `rebalance_s`, between batches, a relay gives back what it holds beyond its fair
share (ceil(SLOTS / relays)) and takes free slots up to it. A slot therefore changes hands only
after its holder's last batch was flushed and marked sent; the next holder reads the rest in id
order. The lock keys are derived from the outbox's qualified name, so two Lapse installations in
one database (different schemas) do not share slots.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text

from lapse.kernel.database import qualified_name
from lapse.kernel.logs import get_logger
from lapse.kernel.models import outbox
from lapse.producers.relay_queries import SLOTS

log = get_logger("relay")

# Granted two-key advisory locks of this database (other databases' relays have slots of their own).
_OUR_ADVISORY_LOCKS = ("locktype = 'advisory' AND granted AND objsubid = 2"
                       " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
# Seconds between a relay's looks at its share of the slots (`lapse run` and `lapse relay`).
REBALANCE_S = 2.0


def lock_classes(engine: Engine) -> tuple[int, int]:
    """The advisory lock classes (first key) of the slots and of the members, for this outbox."""
    base = zlib.crc32(qualified_name(engine, outbox).encode()) & 0x7FFFFFFE
    return base, base | 1


def slot_holders(engine: Engine) -> dict[int, int]:
    """How many slots each relay holds now, by its backend pid (for the bench and tests)."""
    slot_class, _ = lock_classes(engine)
    with engine.connect() as conn:
        rows = conn.execute(text(
            f"SELECT pid, count(*) FROM pg_locks WHERE {_OUR_ADVISORY_LOCKS}"
            f" AND classid::int = {slot_class} GROUP BY pid")).all()
    return {pid: n for pid, n in rows}


def fair_share(members: int) -> int:
    """The most slots one of `members` relays holds once they are balanced."""
    return -(-SLOTS // max(members, 1))


class SlotLease:
    """One relay's hold on a set of slots, on its own connection (`connection()`); `rebalance()`
    between batches; `release()` when the relay stops; `drop()` when the connection failed."""

    def __init__(self, engine: Engine, *, rebalance_s: float = REBALANCE_S,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.engine = engine
        self.rebalance_s = rebalance_s
        self.clock = clock
        self.rng = rng or random.Random()
        self.slot_class, self.member_class = lock_classes(engine)
        self.slots: frozenset[int] = frozenset()
        self._conn: Connection | None = None
        self._due = 0.0

    def connection(self) -> Connection:
        """The lease's connection, opened with the member lock taken on first use (and after a
        `drop`); a new session holds no slot until the next `rebalance`."""
        if self._conn is None:
            conn = self.engine.connect()
            try:
                with conn.begin():
                    conn.execute(text(f"SELECT pg_advisory_lock({self.member_class}, pg_backend_pid())"))
            except Exception:
                conn.invalidate()
                conn.close()
                raise
            self._conn, self.slots, self._due = conn, frozenset(), 0.0
        return self._conn

    def rebalance(self) -> frozenset[int]:
        """Every `rebalance_s` (at once on a new session): give back the slots beyond the fair
        share, then take free ones up to it. Returns the slots held."""
        now = self.clock()
        if self._conn is not None and now < self._due:
            return self.slots
        conn = self.connection()
        self._due = now + self.rebalance_s
        with conn.begin():
            held_by_any = conn.execute(text(
                f"SELECT classid::int, objid::int FROM pg_locks WHERE {_OUR_ADVISORY_LOCKS}"
                f" AND classid::int IN ({self.slot_class}, {self.member_class})")).all()
            members = sum(1 for cls, _ in held_by_any if cls == self.member_class)
            taken = {slot for cls, slot in held_by_any if cls == self.slot_class}
            share = fair_share(members)
            kept = sorted(self.slots)
            for slot in kept[share:]:
                conn.execute(text(f"SELECT pg_advisory_unlock({self.slot_class}, {slot})"))
            held = set(kept[:share])
            free = [s for s in range(SLOTS) if s not in taken]
            self.rng.shuffle(free)  # relays starting together do not race for the same slots
            for slot in free:
                if len(held) >= share:
                    break
                if conn.execute(text(f"SELECT pg_try_advisory_lock({self.slot_class}, {slot})")).scalar_one():
                    held.add(slot)
        if held != self.slots:
            log.info("relay slots rebalanced", extra={"relays": members, "slots": len(held),
                                                      "gave": len(self.slots - held), "took": len(held - self.slots)})
        self.slots = frozenset(held)
        return self.slots

    def release(self) -> None:
        """Give back every slot and the member lock and close the connection (after the relay's
        last batch). If the unlock fails, the connection is discarded: its session ends, and its
        locks with it."""
        conn, self._conn, self.slots = self._conn, None, frozenset()
        if conn is None:
            return
        try:
            with conn.begin():
                conn.execute(text("SELECT pg_advisory_unlock_all()"))
        except Exception:
            conn.invalidate()
        conn.close()

    def drop(self) -> None:
        """The connection failed (an outage): discard it, so its session and locks end; the next
        `connection()` opens a new one."""
        conn, self._conn, self.slots = self._conn, None, frozenset()
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:  # the connection is gone either way
                log.debug("relay lease connection already closed")
