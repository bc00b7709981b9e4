"""SQL shared by every room that writes the ledger: pending rows, transitions, outbox rows.

Statements work on PostgreSQL and SQLite; each call is one round trip for the whole batch
(`lapse.kernel.batch_sql` keeps their text independent of the batch size on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from lapse.kernel.batch_sql import bulk_insert
from lapse.kernel.ledger import PENDING, ExpiryEvent
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox


def pending_row(event: ExpiryEvent, now: datetime) -> dict[str, Any]:
    return {
        "op_key": event.op_key,
        "kind": event.kind,
        "tenant": event.tenant,
        "subject_id": event.subject_id,
        "state": PENDING,
        "attempt": event.attempt,
        "due_at": event.due_at,
        "correlation_id": event.correlation_id,
        "source": event.source,
        "replay_id": event.replay_id,
        "duplicates": 0,
        "created_at": now,
        "updated_at": now,
    }


def insert_pending(conn: Connection, events: Sequence[ExpiryEvent], now: datetime) -> list[str]:
    """Create `pending` ledger rows for events that have none; returns the op keys created."""
    rows = [pending_row(e, now) for e in events]
    created = bulk_insert(conn, cleanup_ledger, rows, ignore_conflicts=True, returning=["op_key"])
    return [r.op_key for r in created]


def record_transitions(conn: Connection, rows: Sequence[dict]) -> None:
    """Append transitions (op_key, from_state, to_state, attempt, actor, at, …) in one statement."""
    if rows:
        bulk_insert(conn, ledger_transitions, rows)


def transition(
    op_key: str,
    from_state: str | None,
    to_state: str,
    attempt: int,
    actor: str,
    at: datetime,
    *,
    failure_class: str | None = None,
    reason: str | None = None,
    replay_id: str | None = None,
    correlation_id: str | None = None,
) -> dict[str, Any]:
    return {
        "op_key": op_key,
        "from_state": from_state,
        "to_state": to_state,
        "attempt": attempt,
        "failure_class": failure_class,
        "reason": reason,
        "actor": actor,
        "replay_id": replay_id,
        "correlation_id": correlation_id,
        "at": at,
    }


def outbox_row(
    topic: str, key: str, schema: str, payload: dict, now: datetime, headers: dict | None = None
) -> dict[str, Any]:
    """An outbox row; datetimes in `payload` must already be epoch milliseconds (JSON column)."""
    return {
        "topic": topic,
        "key": key,
        "schema": schema,
        "payload": payload,
        "headers": headers or {},
        "created_at": now,
    }


def insert_outbox(conn: Connection, rows: Sequence[dict]) -> None:
    bulk_insert(conn, outbox, rows)


def millis(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)
