"""One operation's whole history for `lapse show`: its ledger row, every transition (failed
attempts with their class and reason, replays with their id), the outbox records written for it
with when each was sent, and, for a dead letter, its failure history; and the operations of a
subject that lapsed more than once (a kind with a generation). The SQL is in `history_queries`;
times here are UTC ISO 8601 strings.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from lapse.kernel.ledger import DEAD_LETTER, op_key_parts, parse_op_key
from lapse.kernel.schema_names import DEAD_LETTER_RECORD
from lapse.kernel.topology import Topology
from lapse.readers.history_queries import (
    LedgerRecord,
    OutboxRecord,
    TransitionRecord,
    known_kind,
    known_tenant,
    lapses_statement,
    ledger_record,
    op_keys_of_correlation,
    outbox_of,
    tenant_page,
    transitions_of,
)

# The fields of an outbox record's payload `lapse show` tells (never a dead letter's original bytes).
RECORD_FIELDS = ("status", "attempt", "failure_class", "reason", "due_at", "source", "replay_id", "worker")
_MILLIS_FIELDS = ("due_at",)


def iso(at: datetime | None) -> str | None:
    """`at` in UTC, ISO 8601 to the millisecond with a Z (None stays None)."""
    if at is None:
        return None
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _from_millis(value: Any) -> Any:
    return iso(datetime.fromtimestamp(value / 1000, UTC)) if isinstance(value, int) else value


def topic_role(topology: Topology | None, topic: str) -> str | None:
    """What `topic` is in `topology`: expiry, outcomes, dlq or `delay <n>s` (None: not declared)."""
    if topology is None:
        return None
    for role in ("expiry", "outcomes", "dlq"):
        if getattr(topology, role) == topic:
            return role
    return next((f"delay {tier.delay_s}s" for tier in topology.tiers if tier.topic == topic), None)


def _ledger(row: LedgerRecord) -> dict[str, Any]:
    return {name: iso(value) if isinstance(value, datetime) else value for name, value in asdict(row).items()}


def _transition(t: TransitionRecord) -> dict[str, Any]:
    out = asdict(t)
    out["at"] = iso(t.at)
    return out


def _outbox(o: OutboxRecord, topology: Topology | None) -> dict[str, Any]:
    record = {f: (_from_millis(o.payload[f]) if f in _MILLIS_FIELDS else o.payload[f])
              for f in RECORD_FIELDS if f in o.payload}
    if o.schema == DEAD_LETTER_RECORD:
        record["history"] = [{**h, "at": _from_millis(h.get("at"))} for h in o.payload.get("history") or []]
    return {"id": o.id, "topic": o.topic, "role": topic_role(topology, o.topic), "schema": o.schema,
            "record": record, "headers": dict(o.headers), "created_at": iso(o.created_at),
            "sent_at": iso(o.sent_at)}


def operation_history(conn: Connection, op_key: str, topology: Topology | None = None) -> dict[str, Any] | None:
    """The history of `op_key` as plain data (None: no ledger row): `ledger` (every column),
    `transitions` and `outbox` oldest first, `replay_ids` in the order first seen, and
    `dead_letter` (its last failure and failure history) when the row is a dead letter now."""
    row = ledger_record(conn, op_key)
    if row is None:
        return None
    transitions = transitions_of(conn, row)
    outbox = outbox_of(conn, row)
    replay_ids = list(dict.fromkeys(
        [t.replay_id for t in transitions if t.replay_id] + ([row.replay_id] if row.replay_id else [])))
    dead_letter = None
    if row.state == DEAD_LETTER:
        dead_letter = {"failure_class": row.last_failure_class, "reason": row.last_failure,
                       "attempt": row.attempt, "at": iso(row.finished_at),
                       "history": [{"attempt": t.attempt, "failure_class": t.failure_class, "reason": t.reason,
                                    "at": iso(t.at), "replay_id": t.replay_id}
                                   for t in transitions if t.failure_class is not None]}
    return {"op_key": op_key, "ledger": _ledger(row), "transitions": [_transition(t) for t in transitions],
            "outbox": [_outbox(o, topology) for o in outbox], "replay_ids": replay_ids,
            "dead_letter": dead_letter}


def has_operation(conn: Connection, op_key: str) -> bool:
    """Whether `op_key` has a ledger row (one probe of the primary key)."""
    return ledger_record(conn, op_key) is not None


def lapse_op_keys(conn: Connection, op_key: str, limit: int) -> list[str]:
    """For an op key without a generation (`<kind>:<subject_id>`), the op keys of every lapse of that
    subject, oldest first, at most `limit` (the key itself among them when it has a row); empty for
    an op key that names a generation (it is one lapse)."""
    kind, subject_id, generation = op_key_parts(op_key)
    if generation is not None:
        return []
    return list(conn.execute(lapses_statement(kind, subject_id, limit)).scalars())


def correlated_op_keys(conn: Connection, correlation_id: str, since: datetime, until: datetime,
                       limit: int) -> list[str]:
    """Op keys of the operations created with `correlation_id`, oldest first; when there are none,
    those whose transitions in [since, until) carry it, first seen first."""
    return op_keys_of_correlation(conn, correlation_id, since, until, limit)


def tenant_operations(conn: Connection, tenant: str, kind: str | None, after: str | None,
                      limit: int) -> dict[str, Any]:
    """A page of `tenant`'s operations (of `kind`, when given) after the op key `after`, in (kind,
    op key) order: `operations` (op key, kind, state, attempt, due, updated, last failure class) and
    `next`, the op key to give as `after` for the next page (None: this was the last)."""
    start = (parse_op_key(after)[0], after) if after is not None else None
    lines = tenant_page(conn, tenant, kind, start, limit + 1)
    shown = [{**asdict(line), "due_at": iso(line.due_at), "updated_at": iso(line.updated_at)}
             for line in lines[:limit]]
    return {"tenant": tenant, "kind": kind, "operations": shown,
            "next": shown[-1]["op_key"] if len(lines) > limit else None}


__all__ = ["correlated_op_keys", "has_operation", "iso", "known_kind", "known_tenant", "lapse_op_keys",
           "operation_history", "tenant_operations", "topic_role"]
