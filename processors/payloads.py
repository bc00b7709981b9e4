"""Payloads of the records a batch writes to the outbox: outcomes and ledger-backed dead letters.

Datetimes are epoch milliseconds: the outbox keeps payloads in a JSON column.
"""

from __future__ import annotations

from datetime import datetime

from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.ledger_queries import millis


def outcome_payload(
    event: ExpiryEvent, status: str, attempt: int, now: datetime, worker: str,
    failure_class: str | None = None, reason: str | None = None,
) -> dict:
    return {
        "op_key": event.op_key,
        "kind": event.kind,
        "tenant": event.tenant,
        "subject_id": event.subject_id,
        "status": status,
        "attempt": attempt,
        "failure_class": failure_class,
        "reason": reason,
        "due_at": millis(event.due_at),
        "occurred_at": millis(now),
        "correlation_id": event.correlation_id,
        "replay_id": event.replay_id,
        "worker": worker,
    }


def dead_letter_payload(event: ExpiryEvent, failure_class: str, reason: str, attempt: int,
                        now: datetime, position: tuple[str, int, int] | None) -> dict:
    topic, partition, offset = position or ("", -1, -1)
    return {
        "op_key": event.op_key,
        "kind": event.kind,
        "tenant": event.tenant,
        "subject_id": event.subject_id,
        "failure_class": failure_class,
        "reason": reason,
        "attempt": attempt,
        "history": [],
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "original_key": None,
        "original_value": None,
        "original_headers": {},
        "dead_lettered_at": millis(now),
        "correlation_id": event.correlation_id,
        "replay_id": event.replay_id,
    }
