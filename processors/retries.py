"""Persisting failed attempts: a retry schedule with its wake-up, or a dead letter with its history.

Everything goes through the caller's transaction: the ledger row (attempt, due_at, failure), a
transition, and outbox rows — the wake-up record for the delay tier, the DLQ record, the outcome.
The wake-up rides the outbox so a crash after the commit can never lose it (the relay publishes
it at least once; a copy that arrives early is handed back, a stale one is absorbed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import Connection, select

from lapse.kernel.delays import delay_record
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import DEAD_LETTER, RETRY_SCHEDULED, ExpiryEvent
from lapse.kernel.ledger_queries import millis, outbox_row, transition
from lapse.kernel.models import ledger_transitions
from lapse.processors import queries
from lapse.processors.failures import EffectFailure, decide
from lapse.processors.payloads import dead_letter_payload, outcome_payload


@dataclass(frozen=True)
class FailedAttempt:
    """One claimed event whose attempt failed, with the ledger state and attempt it was claimed in."""

    event: ExpiryEvent
    failure: EffectFailure
    from_state: str
    attempt_before: int
    position: tuple[str, int, int] | None = None


def history(conn: Connection, op_keys: list[str]) -> dict[str, list[dict]]:
    """Earlier failed attempts per op key, oldest first, as DLQ FailureEntry records."""
    if not op_keys:
        return {}
    T = ledger_transitions
    rows = conn.execute(
        select(T.c.op_key, T.c.attempt, T.c.failure_class, T.c.reason, T.c.at)
        .where(T.c.op_key.in_(op_keys), T.c.failure_class.is_not(None))
        .order_by(T.c.id)
    )
    out: dict[str, list[dict]] = {}
    for key, attempt, cls, reason, at in rows:
        out.setdefault(key, []).append(
            {"attempt": attempt, "failure_class": cls, "reason": reason or "", "at": millis(at)})
    return out


def wakeup_row(event: ExpiryEvent, due_at: datetime, attempt: int, now: datetime, *, topics,
               source: str = "retry") -> dict:
    """An outbox row that puts `event` on the smallest delay tier covering the wait."""
    topic, headers = delay_record(topics.tiers, topics.delay_prefix, due_at, now, topics.expiry)
    woken = replace(event, due_at=due_at, attempt=attempt, source=source)
    payload = woken.to_record(now)
    payload["due_at"], payload["produced_at"] = millis(due_at), millis(now)
    return outbox_row(topic, event.op_key, "expiry_event", payload, now,
                      headers={k: v.decode() for k, v in headers})


def record_failures(conn: Connection, failed: list[FailedAttempt], *, kinds: dict[str, CleanupKind],
                    topics, worker: str, now: datetime, rng: random.Random,
                    transitions: list[dict], outbox: list[dict]) -> tuple[list[str], list[str]]:
    """Move rows this worker has claimed to retry_scheduled or dead_letter; returns (retried,
    dead-lettered) keys. The caller must hold the claims (checked in the same transaction).
    Transitions and outbox rows are appended to the caller's lists (written once per batch)."""
    rows, retried, dead = [], [], []
    past = history(conn, [f.event.op_key for f in failed])
    for f in failed:
        event = f.event
        d = decide(kinds[event.kind], f.attempt_before, f.failure, now, rng)
        state = RETRY_SCHEDULED if d.retry else DEAD_LETTER
        rows.append({"op_key": event.op_key, "state": state, "attempt": d.attempt,
                     "due_at": d.due_at or event.due_at, "failure_class": d.failure_class,
                     "failure": d.reason, "finished_at": None if d.retry else now})
        transitions.append(transition(
            event.op_key, f.from_state, state, d.attempt, worker, now, failure_class=d.failure_class,
            reason=d.reason, replay_id=event.replay_id, correlation_id=event.correlation_id))
        outbox.append(outbox_row(
            topics.outcomes, event.op_key, "cleanup_outcome",
            outcome_payload(event, state, d.attempt, now, worker, d.failure_class, d.reason), now))
        if d.retry:
            retried.append(event.op_key)
            outbox.append(wakeup_row(event, d.due_at, d.attempt, now, topics=topics))
            continue
        dead.append(event.op_key)
        entries = [*past.get(event.op_key, []),
            {"attempt": d.attempt, "failure_class": f.failure.failure_class, "reason": f.failure.reason,
             "at": millis(now)}]
        payload = dead_letter_payload(event, d.failure_class, d.reason, d.attempt, now, f.position)
        payload["history"] = entries
        outbox.append(outbox_row(topics.dlq, event.op_key, "dead_letter", payload, now,
                                 headers={"failure_class": d.failure_class, "reason": d.reason[:200]}))
    queries.finish_with_failure(conn, rows, worker, now)
    return retried, dead
