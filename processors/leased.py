"""Effects outside the database, under a lease: run them, then record them in a second transaction.

How leases are renewed, and why a takeover records each effect once: docs/design/processing.md,
"Leases and external effects".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from lapse.kernel.clock import Clock, now_in
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.ledger import APPLIED, CLAIMED, ExpiryEvent, lock_claims, renew_leases
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.processors.brakes import Held, PauseWatch
from lapse.processors.effect_calls import CallerFactory, EffectCaller, callers_from_settings
from lapse.processors.effects.base import endpoint_of
from lapse.processors.failures import AMBIGUOUS, TEMPORARY, EffectFailure, classify
from lapse.processors.limiter import Limiter
from lapse.processors.retries import FailedAttempt, record_failures
from lapse.processors.rules import external_effect
from lapse.processors.scope import BatchResult, BatchScope

log = get_logger("leased")


class EffectRunner:
    """Runs `EffectCall`s on a thread pool, each through its route's limits (`limiter`, shared with
    every worker; set by `run_leased` on first use). Each kind's caller is built once, on first use,
    by `build` (`callers_from_settings` in a worker; tests pass their own)."""

    def __init__(self, build: CallerFactory, concurrency: int = 8, max_renewals: int = 3) -> None:
        self.build = build
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="effect")
        self.max_renewals = max_renewals
        self.callers: dict[str, EffectCaller] = {}
        self.watch: PauseWatch | None = None  # the pauses the calls check, set on first use
        self.limiter: Limiter | None = None  # the limits the calls go through, set on first use

    def caller(self, kind: CleanupKind) -> EffectCaller:
        """The kind's caller, built on first use (on the batch's thread, not in the pool)."""
        if kind.name not in self.callers:
            self.callers[kind.name] = self.build(kind)
        return self.callers[kind.name]

    def _call(self, kind: CleanupKind, caller: EffectCaller, call: EffectCall, deadline: float) -> None:
        """One call: its route's slots (none came before `deadline`: rate-limited, not made), the
        pauses (a pause made since the claim: the call does not start), the call."""
        ticket = None
        if self.limiter is not None:
            endpoint = endpoint_of(caller, call)
            ticket = self.limiter.gate(kind, endpoint, call.tenant).admit(endpoint, deadline)
        called = False
        try:
            if self.watch is not None:
                self.watch.stop_if_paused(call)
            called = True
            caller(call)
        except BaseException as exc:
            if ticket is not None:
                ticket.gate.finish(ticket, exc, called=called)
            raise
        if ticket is not None:
            ticket.gate.finish(ticket, None)

    def run(self, jobs: list[tuple[CleanupKind, EffectCall]], lease_s: float,
            renew: Callable[[list[str]], None]) -> dict[str, EffectFailure | Held | None]:
        """Run the calls, renewing their leases every lease/3 at most `max_renewals` times; op key →
        None on success, Held for a call a pause stopped before it started, or the classified
        failure (AMBIGUOUS for a call still running after that, TEMPORARY for a kind whose caller
        cannot be built)."""
        out: dict[str, EffectFailure | Held | None] = {}
        futures = {}
        unusable: dict[str, str] = {}  # kind → why its caller could not be built, in this run
        # A call must start while one lease period is left for it; a call not started by then is
        # deferred (rate-limited), never reported ambiguous.
        deadline = time.monotonic() + lease_s / 3 * self.max_renewals
        for kind, call in sorted(jobs, key=lambda job: not job[0].high_priority):  # high priority first
            if kind.name not in unusable:
                try:
                    caller = self.caller(kind)
                except Exception as exc:  # any setup error: reported on the calls, the batch goes on
                    unusable[kind.name] = (f"cannot set up the effect of {kind.name!r}: "
                                           f"{type(exc).__name__}: {one_line(str(exc), 200)}")
                    log.warning(unusable[kind.name], extra={"kind": kind.name})
            if kind.name in unusable:
                out[call.op_key] = EffectFailure(TEMPORARY, unusable[kind.name])
                continue
            futures[self.pool.submit(self._call, kind, caller, call, deadline)] = call.op_key
        pending = set(futures)
        for renewals in range(self.max_renewals + 1):
            if not pending:
                break
            _, pending = wait(pending, timeout=lease_s / 3)
            if not pending or renewals == self.max_renewals:
                break
            renew([futures[f] for f in pending])
            if self.limiter is not None:
                self.limiter.renew()
        if self.limiter is not None:
            self.limiter.release_idle()
        for future, key in futures.items():
            if future in pending:
                out[key] = EffectFailure(AMBIGUOUS, "effect still running when the lease ran out")
                continue
            error = future.exception()
            out[key] = None if error is None else error if isinstance(error, Held) else classify(error)
        return out

    def close(self) -> None:
        """Stop the pool (running calls finish on their own), give the limits' slots back and close
        the callers' clients."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.limiter is not None:
            self.limiter.close()
        for caller in self.callers.values():
            close = getattr(caller, "close", None)
            if close is not None:
                close()
        self.callers.clear()


def complete(scope: BatchScope, events: Sequence[ExpiryEvent],
             outcomes: Mapping[str, EffectFailure | Held | None]) -> BatchResult:
    """The second transaction: record each effect's outcome on the rows this worker still holds
    (locked first): applied, failed, or held (a pause stopped the call before it started); a row
    whose lease another worker took over meanwhile is reported `lost`."""
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
        elif isinstance(failure, Held):
            scope.writes.hold_claim(event, row.attempt, row.due_at, str(failure))
            result.held.append(event.op_key)
        else:
            failed.append(FailedAttempt(event, failure, row.state, row.attempt))
    for kind_name, batch in done.items():
        kind: CleanupKind = scope.kinds[kind_name]
        external_effect(kind).complete(scope.conn, [kind.parse_key(e.subject_key) for e in batch], scope.now)
        for event in batch:
            result.applied.append(event.op_key)
            scope.writes.finish(event, CLAIMED, APPLIED, held[event.op_key].attempt + 1)
    record_failures(scope, failed)
    scope.writes.flush(scope.conn)
    if result.lost:
        log.warning("lease lost before completion", extra={"op_keys": result.lost[:20]})
    return result


def run_leased(runner: EffectRunner, scope: BatchScope, claimed: BatchResult,
               clock: Clock | None = None) -> BatchResult:
    """Run the effects of the events `claimed` leased (renewing their leases in short
    transactions meanwhile), then complete them in one transaction, on the scope's connection;
    each transaction at its own now (`clock()` when set, else the database's)."""
    if not claimed.leased:
        return BatchResult()
    jobs = [(scope.kinds[e.kind], EffectCall(e.kind, e.op_key, claimed.attempts[e.op_key], e.subject_id,
                                             e.tenant, claimed.targets[e.op_key]))
            for e in claimed.leased]

    if runner.watch is None:
        runner.watch = PauseWatch(scope.conn.engine)
    if runner.limiter is None:
        runner.limiter = Limiter(scope.conn.engine, scope.worker, scope.lease.total_seconds())

    def renew(op_keys: list[str]) -> None:
        with scope.conn.begin():
            renew_leases(scope.conn, op_keys, scope.worker, now_in(scope.conn, clock) + scope.lease)

    outcomes = runner.run(jobs, scope.lease.total_seconds(), renew)
    with scope.conn.begin():
        return complete(scope.fresh(now_in(scope.conn, clock)), claimed.leased, outcomes)


def effect_runner(settings: Settings) -> EffectRunner:
    """The worker's runner: each kind's caller from its declaration, concurrency from settings."""
    return EffectRunner(callers_from_settings(settings), settings.processor.effect_concurrency)
