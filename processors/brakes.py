"""The brakes in a batch (docs/design/brakes.md): what a brake stops is parked before any effect
runs, and the budgets are charged for what does run.

Held: work of a paused kind or tenant, of a kind the kinds file no longer declares, or over its
kind's budget; shadowed: work of a shadow-mode kind (`processors.shadow`). Neither is charged an
attempt, and each waits in the ledger, not in a loop, until `lapse.reconciler.release` puts it back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import Engine

from lapse.kernel.brakes import (
    ALL_TENANTS,
    BUDGET,
    Budget,
    Pause,
    Pauses,
    insert_pause,
    lock_budget,
    read_pauses,
    record_usage,
    used_in_window,
)
from lapse.kernel.findings import BUDGET as BUDGET_FINDING
from lapse.kernel.findings import Finding, record_finding
from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.ledger import HELD, TERMINAL, ExpiryEvent, insert_pending, park, read_rows
from lapse.kernel.logs import get_logger
from lapse.kernel.text import one_line
from lapse.processors.scope import BatchScope

log = get_logger("brakes")
REASON_CHARS = 300  # of an operator's words quoted in a held transition's reason
BUDGET_ACTOR = "budget"  # who a spent budget's pause names
# How often a worker's calls of external effects read the pauses again while they run.
WATCH_INTERVAL_S = 1.0


@dataclass
class Stopped:
    """What the brakes stopped in one batch: the events held (op key → why) and shadowed; the
    rest go on. `spent` names the budgets this batch found spent (kind, tenant) → their budget."""

    go: dict[str, ExpiryEvent]
    held: dict[str, tuple[ExpiryEvent, str]] = field(default_factory=dict)
    shadowed: list[ExpiryEvent] = field(default_factory=list)
    spent: dict[tuple[str, str], tuple[Budget, int]] = field(default_factory=dict)


def pause_reason(pause: Pause) -> str:
    """The reason a held transition gives for a pause."""
    return one_line(f"paused ({pause.cause}) by {pause.actor}: {pause.reason}", REASON_CHARS, escape=True)


def undeclared_reason(kind: str) -> str:
    return one_line(f"undeclared: kind {kind!r} is not in the kinds file", REASON_CHARS, escape=True)


def sort_out(scope: BatchScope, unique: Mapping[str, ExpiryEvent]) -> Stopped:
    """Read the pauses once (or take those the transaction read with its now) and sort the batch:
    held (paused, undeclared, over budget), shadowed, or on; a budgeted kind's events that go on
    are charged (`charge_budgets`)."""
    pauses = scope.pauses if scope.pauses is not None else read_pauses(scope.conn)
    stopped = Stopped(go={})
    for key, event in unique.items():
        kind = scope.kinds.get(event.kind)
        pause = pauses.covering(event.kind, event.tenant) if pauses else None
        if kind is None:
            stopped.held[key] = (event, undeclared_reason(event.kind))
        elif pause is not None:
            stopped.held[key] = (event, pause_reason(pause))
        elif kind.shadow:
            stopped.shadowed.append(event)
        else:
            stopped.go[key] = event
    charge_budgets(scope, stopped)
    return stopped


def budget_target(event: ExpiryEvent, budget: Budget) -> tuple[str, str]:
    return event.kind, event.tenant if budget.per_tenant else ALL_TENANTS


def charge_budgets(scope: BatchScope, stopped: Stopped) -> None:
    """For each budgeted kind with events going on: take its lock (until the transaction ends, in
    kind order, so two batches never wait on each other crosswise), count its window and let at
    most what is left go on; the rest are held as over budget. Events whose operation is already
    finished go on uncharged (they are duplicates). The events let through are kept on the scope,
    for `count_usage` to record what they really changed."""
    budgeted = [key for key, event in stopped.go.items() if scope.kinds[event.kind].budget is not None]
    if not budgeted:
        return
    finished = {key for key, row in read_rows(scope.conn, budgeted).items() if row.state in TERMINAL}
    by_target: dict[tuple[str, str], list[str]] = {}
    for key in budgeted:
        event = stopped.go[key]
        budget = scope.kinds[event.kind].budget
        if budget is not None and key not in finished:
            by_target.setdefault(budget_target(event, budget), []).append(key)
    locked: set[str] = set()
    for target in sorted(by_target):
        kind, tenant = target
        budget = scope.kinds[kind].budget
        assert budget is not None
        if kind not in locked:
            lock_budget(scope.conn, kind)
            locked.add(kind)
        left = max(0, budget.max_effects - used_in_window(scope.conn, kind, tenant, budget, scope.now))
        keys = by_target[target]
        scope.charged[target] = set(keys[:left])
        for key in keys[left:]:
            event = stopped.go.pop(key)
            stopped.held[key] = (event, f"over budget: {budget.text()} spent")
            stopped.spent[target] = (budget, budget.max_effects - left)


def hold(scope: BatchScope, held: Mapping[str, tuple[ExpiryEvent, str]]) -> set[str]:
    """Park the claimable ones of `held` as held, each with its reason; returns their op keys."""
    if not held:
        return set()
    events = [event for event, _ in held.values()]
    insert_pending(scope.conn, events, scope.now)
    before = read_rows(scope.conn, held)
    moved = park(scope.conn, list(held), HELD, scope.now)
    for key, row in moved.items():
        event, reason = held[key]
        scope.writes.parked(event, before[key].state, HELD, row.attempt, reason)
        scope.result.held.append(key)
    return set(moved)


def pause_spent(scope: BatchScope, stopped: Stopped, parked: set[str]) -> None:
    """A budget whose excess was really held (not only duplicates) pauses its kind (or tenant),
    cause `budget`, with a finding: it stays paused until an operator resumes it."""
    for (kind, tenant), (budget, used) in sorted(stopped.spent.items()):
        over = [k for k, (e, _) in stopped.held.items() if k in parked and budget_target(e, budget) == (kind, tenant)]
        if not over:
            continue
        pause = Pause(kind, tenant, BUDGET, f"budget of {budget.text()} spent", BUDGET_ACTOR, scope.now,
                      {"max_effects": budget.max_effects, "per_s": budget.per_s, "used": used,
                       "per_tenant": budget.per_tenant})
        if insert_pause(scope.conn, pause):
            record_finding(scope.conn, Finding(BUDGET_FINDING, pause.target, scope.now,
                                               f"{pause.reason}: paused by itself, {len(over)} held", pause.details))
            log.warning("budget spent: the kind pauses itself until an operator resumes it",
                        extra={"kind": kind, "tenant": tenant or None, "budget": budget.text(), "held": len(over)})


def count_usage(scope: BatchScope, lease: timedelta) -> None:
    """Record what each budget charged in this batch really changed: effects applied in this
    transaction, and leased calls (counted at the end of their lease, whatever they turn out to do)."""
    if not scope.charged:
        return
    applied, leased = set(scope.result.applied), {e.op_key for e in scope.result.leased}
    for (kind, tenant), keys in sorted(scope.charged.items()):
        record_usage(scope.conn, kind, tenant, len(keys & applied), scope.now)
        record_usage(scope.conn, kind, tenant, len(keys & leased), scope.now, ahead=lease)
    scope.charged.clear()


class Held(Exception):
    """An effect call not made: its kind or tenant was paused after it was claimed."""


class PauseWatch:
    """The pauses as a worker's effect calls see them while they run: read again at most every
    `interval_s` (one small query), so a call that has not started when a pause is made is held."""

    def __init__(self, engine: Engine, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.read_at = float("-inf")
        self.pauses = Pauses()

    def covering(self, kind: str, tenant: str) -> Pause | None:
        with self.lock:
            if time.monotonic() - self.read_at >= self.interval_s:
                with self.engine.connect() as conn:
                    self.pauses = read_pauses(conn)
                self.read_at = time.monotonic()
            return self.pauses.covering(kind, tenant)

    def stop_if_paused(self, call: EffectCall) -> None:
        """Raise Held when `call`'s kind or tenant is paused now: the call must not start."""
        pause = self.covering(call.kind, call.tenant)
        if pause is not None:
            raise Held(pause_reason(pause))
