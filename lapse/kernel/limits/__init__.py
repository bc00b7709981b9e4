"""Call limits shared by every worker (docs/design/limits.md), every statement on their tables
named here:

- `pacing` — a route's rate and call slots as arithmetic: GCRA slots, halving on a 429, recovery;
- `routes` — the routes' rows: grants of call slots, slowing down, what status shows;
- `slots`  — a route's concurrency slots, leased;
- `stats`  — what each worker saw of each endpoint, for status.
"""

from lapse.kernel.limits.pacing import DECREASE, HORIZON_S, RECOVERY_PER_S, RouteState, Schedule, schedule
from lapse.kernel.limits.routes import (
    Grant,
    RouteKey,
    RouteStatus,
    ensure_route,
    grant,
    route_key,
    routes_status,
    slow_down,
    without_flush,
)
from lapse.kernel.limits.slots import acquire_slots, release_slots, renew_slots
from lapse.kernel.limits.stats import EndpointStats, endpoints_status, write_stats

__all__ = [
    "DECREASE",
    "HORIZON_S",
    "RECOVERY_PER_S",
    "EndpointStats",
    "Grant",
    "RouteKey",
    "RouteState",
    "RouteStatus",
    "Schedule",
    "acquire_slots",
    "endpoints_status",
    "ensure_route",
    "grant",
    "release_slots",
    "renew_slots",
    "route_key",
    "routes_status",
    "schedule",
    "slow_down",
    "without_flush",
    "write_stats",
]
