"""Call limits shared by every worker, on PostgreSQL, against real HTTP servers on loopback.

Three effect runners stand for three workers (each its own engine, limiter and thread pool, the
runner the worker uses): the limited server counts what it received per second of its own clock
and the most requests it had in flight. No broker: the processors' path to the runner is
tests/integration/test_leases.py's and the end to end run is tests/system/test_call_limits_run.py's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from sqlalchemy import select, update

from lapse.kernel.clock import database_clock
from lapse.kernel.database import make_engine
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.kinds.effects import EffectCall, HttpEffect
from lapse.kernel.kinds.limits import Limits
from lapse.kernel.models import limit_routes, limit_slots
from lapse.processors.effects.http import HttpCaller
from lapse.processors.failures import RATE_LIMITED, EffectFailure
from lapse.processors.leased import EffectRunner
from lapse.processors.limiter import Limiter
from lapse.readers.status import limits_status
from lapse.shell.commands.status import _limits_text
from lapse.shell.status_collector import limit_families
from tests.fixtures.effects import Answer, limited_http_server
from tests.fixtures.kinds import demo_kinds

LEASE_S = 30.0
WORKERS = 3

pytestmark = pytest.mark.slow


def http_kind(engine, limits: Limits) -> CleanupKind:
    """A kind whose calls go through `limits` (its other fields are the demo's; the calls are made
    by the callers the tests give the runners)."""
    return replace(demo_kinds(engine)["artifact-delete"], name="notify", limits=limits)


def calls(n: int, worker: int) -> list[EffectCall]:
    return [EffectCall("notify", f"notify:{worker}-{i}", 1, f"{worker}-{i}", "t1", {}) for i in range(n)]


class Worker:
    """One worker's effect runner, limiter and engine, calling `url` for each call."""

    def __init__(self, pg_url: str, name: str, url: str, lease_s: float = LEASE_S, concurrency: int = 8) -> None:
        self.engine = make_engine(pg_url)
        caller = HttpCaller(HttpEffect(url=url + "/hooks/x/{subject_id}", timeout_s=5))
        self.runner = EffectRunner(lambda kind: caller, concurrency=concurrency)
        self.runner.limiter = Limiter(self.engine, name, lease_s)
        self.outcomes: dict[str, object] = {}

    def run(self, kind: CleanupKind, work: list[EffectCall]) -> None:
        self.outcomes = self.runner.run([(kind, c) for c in work], LEASE_S, lambda keys: None)

    def close(self) -> None:
        self.runner.close()
        self.engine.dispose()


def run_together(workers: list[Worker], kind: CleanupKind, per_worker: int) -> None:
    threads = [threading.Thread(target=w.run, args=(kind, calls(per_worker, n))) for n, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


@pytest.fixture
def workers(pg_url):
    made: list[Worker] = []

    def make(url: str, n: int = WORKERS, lease_s: float = LEASE_S) -> list[Worker]:
        made.extend(Worker(pg_url, f"w{i}", url, lease_s) for i in range(n))
        return made[-n:]

    yield make
    for w in made:
        w.close()


def slots(engine, kind: str) -> list[tuple[int, str | None]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(limit_slots.c.slot, limit_slots.c.holder)
                                               .where(limit_slots.c.kind == kind).order_by(limit_slots.c.slot))]


def test_three_workers_share_one_rate_and_one_concurrency(engine, workers):
    """100 calls/s and 5 in flight declared; three workers of 8 threads each make 450 calls. The
    server never saw more than 105 in a second of its clock nor more than 5 at once, every call
    went through, and every concurrency slot is free again."""
    kind = http_kind(engine, Limits(100.0, 5))
    with limited_http_server(10_000, delay_s=0.02) as server:
        group = workers(server.url)
        run_together(group, kind, 150)
    assert [o for w in group for o in w.outcomes.values() if o is not None] == []
    assert len(server.seen) == 450 and {s.status for s in server.seen} == {200}
    assert max(server.per_second_seen().values()) <= 105, server.per_second_seen()
    assert server.max_in_flight <= 5
    assert slots(engine, "notify") == [(n, None) for n in range(5)]


def test_a_429_slows_every_worker_down_and_the_rate_adapts_to_the_far_side(engine, workers):
    """200 calls/s declared against a far side that takes 100: its 429s (Retry-After: 1) halve the
    route's rate for every worker and stop them all for the second. The server never saw more
    than the declared rate in a second, the 429s were few once the rate had adapted, and each
    call the server refused came back rate-limited with its Retry-After (burning no attempt)."""
    kind = http_kind(engine, Limits(200.0))
    with limited_http_server(100, delay_s=0.005) as server:
        group = workers(server.url)
        run_together(group, kind, 150)
    seen = sorted(server.seen, key=lambda s: s.at)
    limited = [s for s in seen if s.status == 429]
    assert max(server.per_second_seen().values()) <= 210
    later = [s for s in seen if s.at >= seen[0].at + 3]  # after the first seconds of adaptation
    # Without adaptation about half the calls would be refused; adapted, the rate still probes above
    # the far side's 100/s every few seconds (additive recovery) and each probe costs a few 429s,
    # which in these two seconds or so of calls is up to 5 % (the 1 % of the issue is for a far side
    # that allows the declared rate: tests/system/test_call_limits_run.py).
    assert sum(s.status == 429 for s in later) <= 0.10 * len(later), (len(limited), len(later))
    outcomes = [o for w in group for o in w.outcomes.values()]
    refused = [o for o in outcomes if isinstance(o, EffectFailure)]
    assert len(limited) <= len(refused) and all(o.failure_class == RATE_LIMITED for o in refused)
    assert sum(o.retry_after == 1.0 for o in refused) == len(limited)
    with engine.connect() as conn:
        route = conn.execute(select(limit_routes).where(limit_routes.c.kind == "notify")).mappings().one()
    assert route["lowered_at"] is not None and route["ceiling_per_s"] == 200


def test_a_retry_after_stops_every_workers_calls_until_it_ends(engine, workers, http_server):
    """One worker's call is answered 429 with Retry-After: 3; the other workers' calls, made
    after it, reach the far side no sooner than 3 s later by its clock, and none of them is sent
    in between."""
    http_server.script("x", Answer(429, {"Retry-After": "3"}), Answer(200))
    kind = http_kind(engine, Limits(1000.0))
    first, *others = workers(http_server.url)
    first.run(kind, calls(1, 0))
    (refused,) = first.outcomes.values()
    assert isinstance(refused, EffectFailure) and refused.retry_after == 3.0
    answered = time.time()
    run_together(others, kind, 20)
    later = http_server.received[1:]
    assert len(later) == 40 and all(o is None for w in others for o in w.outcomes.values())
    with first.engine.connect() as conn:
        until = conn.execute(select(limit_routes.c.blocked_until)).scalar_one()
        assert until is not None and database_clock(conn) >= until
    assert time.time() - answered >= 2.5  # the others waited out the Retry-After (less the round trips)


def test_a_worker_that_dies_gives_its_slots_back_within_its_lease(engine, workers):
    """A worker holds both concurrency slots of a route and dies (nothing given back). Another
    worker gets no slot while that lease lives (its call is not made: rate-limited, no attempt),
    and gets one once the lease has run out by the database's clock."""
    kind = http_kind(engine, Limits(1000.0, 2))
    with limited_http_server(10_000) as server:
        dead, alive = workers(server.url, n=2, lease_s=3.0)
        gate = dead.runner.limiter.gate(kind, "127.0.0.1", "t1")  # type: ignore[union-attr]
        tickets = [gate.admit("127.0.0.1", time.monotonic() + 5) for _ in range(2)]
        assert [t.slot for t in tickets] == [0, 1] and slots(engine, "notify") == [(0, "w0"), (1, "w0")]
        with engine.connect() as conn:
            lease_end = max(conn.execute(select(limit_slots.c.until)).scalars())
        # Within the lease: no slot, the call is deferred, not made.
        alive.runner.max_renewals = 1
        alive.outcomes = alive.runner.run([(kind, calls(1, 1)[0])], 1.5, lambda keys: None)
        (deferred,) = alive.outcomes.values()
        assert isinstance(deferred, EffectFailure) and deferred.failure_class == RATE_LIMITED
        assert deferred.reason.startswith("not started: no call slot of notify came free")
        assert server.seen == []
        # Past it (by the database's clock), the slot is taken over and the call made.
        alive.runner.max_renewals = 3
        alive.run(kind, calls(1, 2))
        assert list(alive.outcomes.values()) == [None] and len(server.seen) == 1
    with engine.connect() as conn:
        taken = conn.execute(select(limit_slots.c.until).where(limit_slots.c.holder.is_(None))).scalars().all()
        assert len(taken) == 1 and database_clock(conn) >= lease_end  # one given back by `alive`
        assert conn.execute(select(limit_slots.c.holder).where(limit_slots.c.holder.is_not(None))
                            ).scalars().all() == ["w0"]


def test_a_changed_declaration_is_taken_by_the_next_worker(engine, workers):
    """A route's row follows the kinds file: a new rate is the new ceiling (the current rate
    clamped to it), a new concurrency the number of slots."""
    with limited_http_server(10_000) as server:
        (one,) = workers(server.url, n=1)
        one.run(http_kind(engine, Limits(50.0, 2)), calls(3, 0))
        with engine.begin() as conn:
            conn.execute(update(limit_routes).values(rate_per_s=40.0))
        (two,) = workers(server.url, n=1)
        two.run(http_kind(engine, Limits(20.0, 3)), calls(3, 1))
    with engine.connect() as conn:
        route = conn.execute(select(limit_routes)).mappings().one()
    assert (route["ceiling_per_s"], route["concurrency"]) == (20.0, 3) and route["rate_per_s"] <= 20.0
    assert [s for s, _ in slots(engine, "notify")] == [0, 1, 2]


def test_a_worker_starts_the_calls_of_a_high_priority_kind_first(engine, pg_url, http_server):
    """A batch whose bulk kind's calls come first in it: the high-priority kind's calls reach the
    far side before any of them (one call at a time, so the order is the start order)."""
    http_server.script("x", Answer(200))
    bulk = http_kind(engine, Limits(1000.0))
    high = replace(bulk, name="urgent", priority="high")
    worker = Worker(pg_url, "w0", http_server.url, concurrency=1)
    try:
        jobs = [(bulk, c) for c in calls(5, 0)] + [(high, replace(c, kind="urgent", op_key=f"urgent:{c.subject_id}"))
                                                   for c in calls(5, 1)]
        assert all(o is None for o in worker.runner.run(jobs, LEASE_S, lambda keys: None).values())
    finally:
        worker.close()
    assert [r.headers["idempotency-key"].split(":")[0] for r in http_server.received] == ["urgent"] * 5 + ["notify"] * 5


def test_status_shows_each_route_and_endpoint_as_every_worker_saw_them(engine, workers, http_server):
    """After a 429 (Retry-After: 2) among 20 calls: `lapse status` shows the route's rate lowered
    and no slot held any more, and the endpoint's calls and 429s over the workers' last minute; the
    status samples carry the same."""
    http_server.script("x", Answer(429, {"Retry-After": "2"}), Answer(200))
    kind = http_kind(engine, Limits(100.0, 4))
    (one,) = workers(http_server.url, n=1)
    one.run(kind, calls(20, 0))
    one.runner.limiter.close()  # type: ignore[union-attr]  # what it saw, written
    with engine.connect() as conn:
        shown = limits_status(conn)
    (route,) = shown["routes"]
    assert (route["kind"], route["route"], route["ceiling_per_s"], route["concurrency"]) == ("notify", "", 100.0, 4)
    assert route["rate_per_s"] < 100.0 and route["slots_held"] == 0
    (endpoint,) = shown["endpoints"]
    host = http_server.url.removeprefix("http://")
    assert (endpoint["kind"], endpoint["endpoint"], endpoint["in_flight"]) == ("notify", host, 0)
    assert endpoint["throttled_share"] == 0.05 and endpoint["calls_per_minute"] >= 20
    lines = _limits_text(shown)
    assert lines[0].startswith("limit notify: ") and " of 100 calls/s, 0/4 in flight" in lines[0]
    assert lines[1].startswith(f"calls notify to {host}: 0 in flight, ") and "(5.0%)" in lines[1]
    samples = {(m.name, s.labels.get("kind")): s.value for m in limit_families(shown) for s in m.samples}
    assert samples[("lapse_limit_ceiling_per_s", "notify")] == 100.0
    assert samples[("lapse_limit_rate_per_s", "notify")] == route["rate_per_s"]
