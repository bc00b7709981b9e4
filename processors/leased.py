"""Effects outside the database, under a lease: run them, then record them in a second transaction.

`apply_batch` claimed the rows (claim_owner/claim_until) and read their targets in the first
transaction. Here the effects run with bounded concurrency and a token bucket per kind, while a
helper thread renews the leases (a bounded number of times); then one transaction locks the rows
still claimed by this worker and marks them applied (and the business rows done), or schedules
the retry / dead letter of each failure. A row whose lease another worker took over meanwhile is
left to that worker.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, select, update

from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import APPLIED, CLAIMED, ExpiryEvent
from lapse.kernel.ledger_queries import insert_outbox, outbox_row, record_transitions, transition
from lapse.kernel.logs import get_logger
from lapse.kernel.models import cleanup_ledger as L
from lapse.kernel.rate_limit import TokenBucket
from lapse.processors import queries
from lapse.processors.failures import AMBIGUOUS, EffectFailure, classify
from lapse.processors.object_store import store_from_settings
from lapse.processors.payloads import outcome_payload
from lapse.processors.retries import FailedAttempt, record_failures

log = get_logger("leased")


@dataclass
class LeasedResult:
    applied: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # lease taken over by another worker meanwhile


class EffectRunner:
    """Runs named actions ("delete-object" → store.delete) on a thread pool, rate-limited per kind."""

    def __init__(self, actions: dict[str, Callable[[str], object]], concurrency: int = 8,
                 max_renewals: int = 3) -> None:
        self.actions = actions
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="effect")
        self.max_renewals = max_renewals
        self.buckets: dict[str, TokenBucket] = {}

    def _bucket(self, kind: CleanupKind) -> TokenBucket:
        if kind.name not in self.buckets:
            self.buckets[kind.name] = TokenBucket(kind.effect_rate_per_s)
        return self.buckets[kind.name]

    def _call(self, kind: CleanupKind, target: str) -> None:
        self._bucket(kind).acquire()
        self.actions[kind.external_effect.action](target)

    def run(self, jobs: list[tuple[str, CleanupKind, str]], lease_s: float,
            renew: Callable[[list[str]], None]) -> dict[str, EffectFailure | None]:
        """Run (op_key, kind, target) jobs; op_key → None on success or the classified failure.

        Leases are renewed every lease/3 while jobs run, at most `max_renewals` times; a job still
        running after that is reported AMBIGUOUS (it may yet land) and its row retried."""
        futures = {self.pool.submit(self._call, kind, target): key for key, kind, target in jobs}
        pending = set(futures)
        for renewals in range(self.max_renewals + 1):
            _, pending = wait(pending, timeout=lease_s / 3)
            if not pending or renewals == self.max_renewals:
                break
            renew([futures[f] for f in pending])
        out: dict[str, EffectFailure | None] = {}
        for future, key in futures.items():
            if future in pending:
                out[key] = EffectFailure(AMBIGUOUS, "effect still running when the lease ran out")
                continue
            exc = future.exception()
            out[key] = None if exc is None else classify(exc)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def renew_leases(engine: Engine, op_keys: list[str], owner: str, until: datetime) -> None:
    """Extend this worker's live claims on `op_keys` to `until`."""
    with engine.begin() as conn:
        conn.execute(update(L).where(L.c.op_key.in_(op_keys), L.c.state == CLAIMED,
                                     L.c.claim_owner == owner).values(claim_until=until))


def owned_claims(conn: Connection, op_keys: list[str], owner: str) -> dict[str, tuple[str, int]]:
    """Lock the rows among `op_keys` still claimed by `owner`: op_key → (state, attempt)."""
    stmt = select(L.c.op_key, L.c.state, L.c.attempt).where(
        L.c.op_key.in_(op_keys), L.c.state == CLAIMED, L.c.claim_owner == owner)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return {key: (state, attempt) for key, state, attempt in conn.execute(stmt)}


def complete(conn: Connection, events: list[ExpiryEvent], outcomes: dict[str, EffectFailure | None],
             *, kinds, topics, worker: str, now: datetime, rng: random.Random,
             positions: dict | None = None) -> LeasedResult:
    """The second transaction: record each effect's outcome on the rows this worker still holds."""
    result = LeasedResult()
    held = owned_claims(conn, [e.op_key for e in events], worker)
    transitions: list[dict] = []
    outbox: list[dict] = []
    done: dict[str, list[ExpiryEvent]] = {}
    failed: list[FailedAttempt] = []
    for event in events:
        if event.op_key not in held:
            result.lost.append(event.op_key)
            continue
        state, attempt = held[event.op_key]
        failure = outcomes.get(event.op_key)
        if failure is None:
            done.setdefault(event.kind, []).append(event)
        else:
            failed.append(FailedAttempt(event, failure, state, attempt,
                                        (positions or {}).get(event.op_key)))
    for kind_name, batch in done.items():
        kind: CleanupKind = kinds[kind_name]
        kind.external_effect.complete(conn, [kind.parse_subject(e.subject_id) for e in batch], now)
        for event in batch:
            attempt = held[event.op_key][1] + 1
            result.applied.append(event.op_key)
            transitions.append(transition(event.op_key, CLAIMED, APPLIED, attempt, worker, now,
                                          replay_id=event.replay_id,
                                          correlation_id=event.correlation_id))
            outbox.append(outbox_row(topics.outcomes, event.op_key, "cleanup_outcome",
                                     outcome_payload(event, APPLIED, attempt, now, worker), now))
    queries.finish(conn, result.applied, worker, APPLIED, now)
    result.retried, result.dead_lettered = record_failures(
        conn, failed, kinds=kinds, topics=topics, worker=worker, now=now, rng=rng,
        transitions=transitions, outbox=outbox)
    record_transitions(conn, transitions)
    insert_outbox(conn, outbox)
    if result.lost:
        log.warning("lease lost before completion", extra={"op_keys": result.lost[:20]})
    return result


def run_leased(engine: Engine, runner: EffectRunner, events: list[ExpiryEvent],
               targets: dict[str, str], *, kinds, topics, worker: str,
               clock: Callable[[], datetime], lease: timedelta, rng: random.Random,
               positions: dict | None = None) -> LeasedResult:
    """Run the effects of leased events, then complete them in one transaction."""
    if not events:
        return LeasedResult()
    jobs = [(e.op_key, kinds[e.kind], targets[e.op_key]) for e in events]
    renew = lambda keys: renew_leases(engine, keys, worker, clock() + lease)
    outcomes = runner.run(jobs, lease.total_seconds(), renew)
    with engine.begin() as conn:
        return complete(conn, events, outcomes, kinds=kinds, topics=topics, worker=worker,
                        now=clock(), rng=rng, positions=positions)


def effect_runner(settings) -> EffectRunner:
    """The runner of the built-in actions, from settings (object store, concurrency)."""
    store = store_from_settings(settings)
    return EffectRunner({"delete-object": store.delete}, settings.effect_concurrency)
