"""What each worker saw of the calls to each endpoint, kept for `lapse status`: one row per
(kind, endpoint, worker), overwritten every few seconds while the worker calls, covering its last
minute. Status sums the rows written recently; rows of workers long gone are removed on the way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite

from lapse.kernel.models import limit_stats as T

FRESH = timedelta(seconds=30)  # a row older than this is a worker that stopped calling
KEEP = timedelta(hours=1)  # then it is removed


@dataclass(frozen=True)
class EndpointStats:
    """Calls of `kind` to `endpoint` over `window_s` seconds: how many, how many answered 429 (or
    a store's SlowDown), the seconds spent waiting for a slot and in the call, and those in flight."""

    kind: str
    endpoint: str
    calls: int = 0
    throttled: int = 0
    waited_s: float = 0.0
    called_s: float = 0.0
    window_s: float = 0.0
    in_flight: int = 0

    def to_dict(self) -> dict[str, object]:
        per_minute = 60.0 / self.window_s if self.window_s else 0.0
        return {"kind": self.kind, "endpoint": self.endpoint, "in_flight": self.in_flight,
                "calls_per_minute": round(self.calls * per_minute, 1),
                "throttled_per_minute": round(self.throttled * per_minute, 1),
                "throttled_share": round(self.throttled / self.calls, 4) if self.calls else 0.0,
                "wait_s_avg": round(self.waited_s / self.calls, 4) if self.calls else 0.0,
                "call_s_avg": round(self.called_s / self.calls, 4) if self.calls else 0.0}


def write_stats(conn: Connection, worker: str, stats: list[EndpointStats], now: datetime) -> None:
    """Overwrite `worker`'s rows with `stats`, at `now` (the database's); drop rows long stale."""
    conn.execute(delete(T).where(T.c.at < now - KEEP))
    if not stats:
        return
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    rows = [{"kind": s.kind, "endpoint": s.endpoint[:300], "worker": worker, "at": now, "in_flight": s.in_flight,
             "calls": s.calls, "throttled": s.throttled, "waited_s": s.waited_s, "called_s": s.called_s,
             "window_s": s.window_s} for s in stats]
    stmt = dialect.insert(T).values(rows)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[T.c.kind, T.c.endpoint, T.c.worker],
        set_={name: stmt.excluded[name] for name in
              ("at", "in_flight", "calls", "throttled", "waited_s", "called_s", "window_s")}))


def endpoints_status(conn: Connection, now: datetime) -> list[EndpointStats]:
    """Per (kind, endpoint), the sums over the workers whose rows are fresh at `now` (the
    window is the longest of theirs: they cover the same last minute)."""
    stmt = (select(T.c.kind, T.c.endpoint, func.sum(T.c.calls), func.sum(T.c.throttled), func.sum(T.c.waited_s),
                   func.sum(T.c.called_s), func.max(T.c.window_s), func.sum(T.c.in_flight))
            .where(T.c.at >= now - FRESH).group_by(T.c.kind, T.c.endpoint).order_by(T.c.kind, T.c.endpoint))
    return [EndpointStats(kind, endpoint, int(calls), int(throttled), float(waited), float(called), float(window),
                          int(in_flight))
            for kind, endpoint, calls, throttled, waited, called, window, in_flight in conn.execute(stmt)]
