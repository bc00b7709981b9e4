"""One kind's due rows, handed to the sweep a page at a time in weighted turns across tenants.

Which tenants have due rows is one grouped read (again every REDISCOVER_S, and whenever the known
rows are spent); each page then gives every tenant a share (its weight over the sum of the weights
of the tenants with rows left; what a tenant with fewer rows leaves goes to the others), each
tenant's rows in (due, id) order from a cursor of its own, the tenants whose rows left fit their
share read together. A page is in turns: the k-th row of a tenant
of weight w at turn k/w. Why not one ranked query per page: docs/design/limits.md.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lapse.kernel.kinds import CleanupKind, EligibleRow

REDISCOVER_S = 2.0  # how often a pass reads again which tenants have due rows
MAX_TENANTS = 10_000  # tenants read per discovery (by name: more wait for one of these to be done)
MAX_QUERIES = 32  # tenants read one by one per page; the others wait for a later page


class FairPages:
    """The sweep's pages of one kind at one pass's `now`; `next_page` until it returns none."""

    def __init__(self, kind: CleanupKind, now: datetime, clock: Callable[[], float] = time.monotonic) -> None:
        self.kind = kind
        self.now = now
        self.clock = clock
        self.left: Counter[str] = Counter()  # due rows each tenant has left, as last read
        self.after: dict[str, tuple[Any, ...]] = {}  # each tenant's cursor: its last row handed out
        self.read_at: float | None = None
        self.turn = 0  # which tenants go first when more than MAX_QUERIES want their own query

    def _discover(self, conn: Connection) -> None:
        if self.kind.has_tenant:
            self.left = Counter({str(tenant): int(n) for tenant, n in
                                 conn.execute(self.kind.due_tenants(self.now, MAX_TENANTS))})
        else:
            self.left = Counter({"": 1_000_000_000})  # one tenant: its rows are read until none come
        self.read_at = self.clock()

    def next_page(self, conn: Connection, limit: int) -> list[EligibleRow]:
        """Up to `limit` rows in turns across the tenants with due rows; [] when none is left."""
        stale = self.read_at is None or self.clock() - self.read_at >= REDISCOVER_S
        if stale or not +self.left:
            self._discover(conn)
        active = sorted(t for t, n in self.left.items() if n > 0)
        if not active:
            return []
        weights = {t: self.kind.tenant_weights.get(t, 1.0) for t in active}
        whole, share = shares(self.left, weights, limit)
        rows: list[EligibleRow] = []
        if whole:
            rows += self._read(conn, whole, None, sum(self.left[t] for t in whole))
        own = sorted(share)
        start = self.turn % len(own) if own else 0
        for tenant in (own[start:] + own[:start])[:MAX_QUERIES]:
            rows += self._read(conn, [tenant], self.after.get(tenant), share[tenant])
        self.turn += MAX_QUERIES
        return in_turns(rows, weights)

    def _read(self, conn: Connection, tenants: list[str], after: tuple[Any, ...] | None, limit: int
              ) -> list[EligibleRow]:
        rows = [self.kind.to_eligible(r) for r in conn.execute(self.kind.tenant_page(self.now, tenants, after, limit))]
        got = Counter(r.tenant if self.kind.has_tenant else "" for r in rows)
        for row in rows:
            self.after[row.tenant if self.kind.has_tenant else ""] = row.cursor
        for tenant in tenants:
            # Fewer rows than asked: the tenant has none left (until the next discovery).
            self.left[tenant] = 0 if len(rows) < limit else max(0, self.left[tenant] - got[tenant])
        return rows


def shares(left: Counter[str], weights: dict[str, float], limit: int) -> tuple[list[str], dict[str, int]]:
    """How a page of `limit` rows is shared (weighted max-min): the tenants whose rows left fit their
    share get them all, what they leave is shared again among the others by weight. Returns the
    tenants taking all their rows, and the others' shares (at least one row each)."""
    pool, room, whole = sorted(weights), float(limit), []
    while pool:
        total = sum(weights[t] for t in pool)
        fits = [t for t in pool if left[t] <= room * weights[t] / total]
        if not fits:
            break
        whole += fits
        room -= sum(left[t] for t in fits)
        pool = [t for t in pool if t not in fits]
    total = sum(weights[t] for t in pool)
    return whole, {t: max(1, math.floor(room * weights[t] / total)) for t in pool}


def in_turns(rows: list[EligibleRow], weights: dict[str, float]) -> list[EligibleRow]:
    """`rows` ordered so tenants alternate: the k-th row of a tenant of weight w at turn k/w, a turn's
    rows by (due, id) (each tenant's rows come in (due, id) order)."""
    seen: Counter[str] = Counter()
    turns = []
    for row in rows:
        seen[row.tenant] += 1
        turns.append((seen[row.tenant] / weights.get(row.tenant, 1.0), row.cursor, row))
    return [row for _, _, row in sorted(turns, key=lambda t: (t[0], t[1]))]
