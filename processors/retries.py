"""Persisting failed attempts: a retry schedule with its wake-up, or a dead letter with its history.

Everything goes into the scope's ledger writes: the ledger row (attempt, due_at, failure), a
transition, and outbox rows — the wake-up record for the delay tier, the DLQ record, the outcome.
The wake-up rides the outbox so a crash after the commit can never lose it (the relay publishes
it at least once; a copy that arrives early is handed back, a stale one is absorbed).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lapse.kernel.delays import delay_record
from lapse.kernel.ledger import DEAD_LETTER, RETRY_SCHEDULED, ExpiryEvent, FailureEntry, failure_history
from lapse.processors.failures import RATE_LIMITED, Deferrals, EffectFailure, decide
from lapse.processors.scope import BatchScope


@dataclass(frozen=True)
class FailedAttempt:
    """One claimed event whose attempt failed, with the ledger state and attempt it was claimed in."""

    event: ExpiryEvent
    failure: EffectFailure
    from_state: str
    attempt_before: int


def wake_up(scope: BatchScope, event: ExpiryEvent, due_at: datetime, attempt: int, source: str) -> None:
    """Put `event` back, due at `due_at`, on the smallest delay tier covering the wait (through
    the outbox, so the wake-up commits with the ledger change that schedules it)."""
    topic, headers = delay_record(scope.topics, due_at, scope.now)
    scope.writes.expiry(topic, event._replace(due_at=due_at, attempt=attempt, source=source),
                        {key: value.decode() for key, value in headers})


def deferrals(history: list[FailureEntry], replay_id: str | None) -> Deferrals:
    """The current run's failures (those under the event's replay id; a replay starts afresh) as
    the rate-limit deadline counts them: the rate-limited ones, and the first failure's time."""
    run = [h for h in history if h.replay_id == replay_id]
    return Deferrals(sum(h.failure_class == RATE_LIMITED for h in run), run[0].at if run else None)


def record_failures(scope: BatchScope, failed: list[FailedAttempt]) -> None:
    """Move rows this worker has claimed to retry_scheduled or dead_letter, each as the retry policy
    decides, and add them to the result's `retried` or `dead_lettered`. The caller must hold the
    claims (checked in the same transaction when the writes are flushed)."""
    if not failed:
        return
    past = failure_history(scope.conn, [f.event.op_key for f in failed])
    for f in failed:
        event = f.event
        d = decide(scope.kinds[event.kind], f.attempt_before, f.failure, scope.now, scope.rng,
                   deferrals(past.get(event.op_key, []), event.replay_id))
        due_at = d.due_at or event.due_at
        if d.retry:
            scope.writes.fail(event, f.from_state, RETRY_SCHEDULED, d.attempt, due_at, d.failure_class, d.reason)
            wake_up(scope, event, due_at, d.attempt, source="retry")
            scope.result.retried.append(event.op_key)
            continue
        scope.writes.fail(event, f.from_state, DEAD_LETTER, d.attempt, due_at, d.failure_class, d.reason)
        history = [*past.get(event.op_key, []),
                   FailureEntry(d.attempt, f.failure.failure_class, f.failure.reason, scope.now,
                                event.replay_id)]
        scope.writes.dead_letter(scope.topics.dlq, event, d.failure_class, d.reason, d.attempt, history,
                                 scope.positions.get(event.op_key))
        scope.result.dead_lettered.append(event.op_key)
