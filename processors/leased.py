"""Effects outside the database, under a lease: run them, then record them in a second transaction.

`apply_batch` claimed the rows (claim_owner/claim_until) and read their targets in the first
transaction. Here the effects run with bounded concurrency and a token bucket per kind, while the
leases are renewed (a bounded number of times); then one transaction locks the rows still
claimed by this worker and marks them applied (and the business rows done), or schedules the
retry / dead letter of each failure. A row whose lease another worker took over meanwhile is
left to that worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime

from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import APPLIED, CLAIMED, ExpiryEvent, lock_claims, renew_leases
from lapse.kernel.logs import get_logger
from lapse.kernel.rate_limit import TokenBucket
from lapse.kernel.settings import Settings
from lapse.processors.failures import AMBIGUOUS, EffectFailure, classify
from lapse.processors.object_store import store_from_settings
from lapse.processors.retries import FailedAttempt, record_failures
from lapse.processors.rules import external_effect
from lapse.processors.scope import BatchResult, BatchScope

log = get_logger("leased")


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
        self.actions[external_effect(kind).action](target)

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


def complete(scope: BatchScope, events: Sequence[ExpiryEvent],
             outcomes: Mapping[str, EffectFailure | None]) -> BatchResult:
    """The second transaction: record each effect's outcome on the rows this worker still holds
    (locked first); a row whose lease another worker took over meanwhile is reported `lost`."""
    result = scope.result
    held = lock_claims(scope.conn, [e.op_key for e in events], scope.worker)
    done: dict[str, list[ExpiryEvent]] = {}
    failed: list[FailedAttempt] = []
    for event in events:
        row = held.get(event.op_key)
        if row is None:
            result.lost.append(event.op_key)
            continue
        failure = outcomes.get(event.op_key)
        if failure is None:
            done.setdefault(event.kind, []).append(event)
        else:
            failed.append(FailedAttempt(event, failure, row.state, row.attempt))
    for kind_name, batch in done.items():
        kind: CleanupKind = scope.kinds[kind_name]
        external_effect(kind).complete(scope.conn, [kind.parse_subject(e.subject_id) for e in batch], scope.now)
        for event in batch:
            result.applied.append(event.op_key)
            scope.writes.finish(event, CLAIMED, APPLIED, held[event.op_key].attempt + 1)
    record_failures(scope, failed)
    scope.writes.flush(scope.conn)
    if result.lost:
        log.warning("lease lost before completion", extra={"op_keys": result.lost[:20]})
    return result


def run_leased(runner: EffectRunner, scope: BatchScope, claimed: BatchResult,
               clock: Callable[[], datetime]) -> BatchResult:
    """Run the effects of the events `claimed` leased (renewing their leases in short
    transactions meanwhile), then complete them in one transaction, on the scope's connection."""
    if not claimed.leased:
        return BatchResult()
    jobs = [(e.op_key, scope.kinds[e.kind], claimed.targets[e.op_key]) for e in claimed.leased]

    def renew(op_keys: list[str]) -> None:
        with scope.conn.begin():
            renew_leases(scope.conn, op_keys, scope.worker, clock() + scope.lease)

    outcomes = runner.run(jobs, scope.lease.total_seconds(), renew)
    with scope.conn.begin():
        return complete(scope.fresh(clock()), claimed.leased, outcomes)


def effect_runner(settings: Settings) -> EffectRunner:
    """The runner of the built-in actions, from settings (object store, concurrency)."""
    store = store_from_settings(settings)
    return EffectRunner({"delete-object": store.delete}, settings.processor.effect_concurrency)
