"""The routes of external calls and every statement on their rows: a route is what shares one
limit (a kind's calls, or those to one endpoint or of one tenant of it). A grant hands out call
slots at the route's rate under the row's lock; a 429 halves the rate and a Retry-After blocks the
route, for every worker at once. All times are the database's (`database_clock`, read after the
lock). The arithmetic is `pacing`'s; the design, docs/design/limits.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from lapse.kernel.clock import database_clock
from lapse.kernel.kinds.limits import Limits
from lapse.kernel.limits.pacing import HORIZON_S, RouteState, lowered, lowers, rate_now, schedule
from lapse.kernel.models import limit_routes as R
from lapse.kernel.models import limit_slots as S

ROUTE_CHARS = 300
STATE = (R.c.ceiling_per_s, R.c.rate_per_s, R.c.rate_at, R.c.next_at, R.c.lowered_at, R.c.blocked_until)


@dataclass(frozen=True, order=True)
class RouteKey:
    """A route: the kind and '' (the whole kind), 'endpoint:HOST' or 'tenant:NAME'."""

    kind: str
    route: str = ""

    def label(self) -> str:
        return self.kind + (f" {self.route}" if self.route else "")


def route_key(kind: str, limits: Limits, endpoint: str, tenant: str) -> RouteKey:
    """The route a call of `kind` to `endpoint` for `tenant` goes through, as its limits say."""
    if limits.per == "endpoint":
        return RouteKey(kind, f"endpoint:{endpoint}"[:ROUTE_CHARS])
    if limits.per == "tenant":
        return RouteKey(kind, f"tenant:{tenant}"[:ROUTE_CHARS])
    return RouteKey(kind)


def without_flush(conn: Connection) -> None:
    """Let this transaction commit without waiting for its WAL flush (PostgreSQL): a limit's state
    is not worth a flush per grant; a database crash loses at most its last instants, which can
    only let through the calls in flight at that moment twice over (docs/design/limits.md)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL synchronous_commit = off"))


def _where(key: RouteKey):  # type: ignore[no-untyped-def]
    return (R.c.kind == key.kind, R.c.route == key.route)


def _insert_ignoring(conn: Connection, table, rows: list[dict[str, object]]) -> None:  # type: ignore[no-untyped-def]
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(dialect.insert(table).values(rows).on_conflict_do_nothing())


def ensure_route(conn: Connection, key: RouteKey, limits: Limits) -> None:
    """Create the route's row (at its declared rate) and its concurrency slots if missing, and take
    the declaration as it is now: a changed rate is the new ceiling (the current rate clamped to it),
    a changed concurrency the new number of slots."""
    now = database_clock(conn)
    _insert_ignoring(conn, R, [{"kind": key.kind, "route": key.route, "ceiling_per_s": limits.rate_per_s,
                                "rate_per_s": limits.rate_per_s, "rate_at": now, "next_at": now,
                                "concurrency": limits.concurrency}])
    row = conn.execute(select(R.c.ceiling_per_s, R.c.rate_per_s, R.c.concurrency).where(*_where(key))
                       .with_for_update()).one()
    if (row.ceiling_per_s, row.concurrency) != (limits.rate_per_s, limits.concurrency):
        conn.execute(update(R).where(*_where(key)).values(
            ceiling_per_s=limits.rate_per_s, rate_per_s=min(row.rate_per_s, limits.rate_per_s), rate_at=now,
            concurrency=limits.concurrency))
    if limits.concurrency:
        _insert_ignoring(conn, S, [{"kind": key.kind, "route": key.route, "slot": n}
                                   for n in range(limits.concurrency)])


def _state(conn: Connection, key: RouteKey) -> RouteState:
    return RouteState(*conn.execute(select(*STATE).where(*_where(key)).with_for_update()).one())


@dataclass(frozen=True)
class Grant:
    """Call slots of a route, as times of the database's clock, and the clock when they were
    granted; none when the route is blocked (until `blocked_until`) or booked ahead: ask again at
    `wait_until`."""

    at: datetime
    slots: list[datetime]
    rate_per_s: float
    wait_until: datetime | None = None
    blocked_until: datetime | None = None


def grant(conn: Connection, key: RouteKey, want: int, horizon_s: float = HORIZON_S) -> Grant:
    """Up to `want` call slots of the route (`pacing.schedule`), booked under the row's lock."""
    state = _state(conn, key)
    now = database_clock(conn)
    plan = schedule(state, now, want, horizon_s)
    if plan.count:
        conn.execute(update(R).where(*_where(key)).values(next_at=plan.next_at, rate_per_s=plan.rate_per_s,
                                                          rate_at=now))
    blocked = state.blocked_until if state.blocked_until is not None and state.blocked_until > now else None
    return Grant(now, plan.slots(), plan.rate_per_s, plan.wait_until, blocked)


def slow_down(conn: Connection, key: RouteKey, now: datetime, *, paced_at: datetime | None,
              block_s: float | None) -> None:
    """What the far side's answer asks of every worker: a 429 to a call whose slot was granted at
    `paced_at` halves the route's rate (once per halving: `pacing.lowers`); a Retry-After of
    `block_s` seconds blocks the route until `now` (the database's) plus that."""
    state = _state(conn, key)
    values: dict[str, object] = {}
    if paced_at is not None and lowers(state, paced_at):
        values.update(rate_per_s=lowered(state, now), rate_at=now, lowered_at=now)
    if block_s:
        until = now + timedelta(seconds=block_s)
        if state.blocked_until is None or until > state.blocked_until:
            values["blocked_until"] = until
    if values:
        conn.execute(update(R).where(*_where(key)).values(**values))


@dataclass(frozen=True)
class RouteStatus:
    """A route as status shows it: rates, the end of a Retry-After, the slots held now."""

    key: RouteKey
    ceiling_per_s: float
    rate_per_s: float
    blocked_until: datetime | None
    concurrency: int | None
    slots_held: int = 0


def routes_status(conn: Connection, now: datetime, used_within: timedelta = timedelta(hours=1)) -> list[RouteStatus]:
    """Every route used within `used_within` of `now` (its last slot booked since, or still blocked),
    with its rate at `now` and its concurrency slots held under a live lease."""
    held = {RouteKey(kind, route): n for kind, route, n in conn.execute(
        select(S.c.kind, S.c.route, func.count()).where(S.c.holder.is_not(None), S.c.until > now)
        .group_by(S.c.kind, S.c.route))}
    out = []
    for row in conn.execute(select(R.c.kind, R.c.route, R.c.concurrency, *STATE).order_by(R.c.kind, R.c.route)):
        state = RouteState(*row[3:])
        if state.next_at < now - used_within and not (state.blocked_until and state.blocked_until > now):
            continue
        key = RouteKey(row.kind, row.route)
        blocked = state.blocked_until if state.blocked_until and state.blocked_until > now else None
        out.append(RouteStatus(key, state.ceiling_per_s, rate_now(state, now), blocked, row.concurrency,
                               held.get(key, 0)))
    return out
