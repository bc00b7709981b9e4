"""The records about the ledger's work: expiry events (the work), cleanup outcomes (what happened)
and dead letters (what could not happen), with the one factory of expiry events and the one
serializer of each record type.

Serialized records carry timestamps as epoch milliseconds, so one dict fits both the outbox's JSON
column and the Avro codec (whose timestamp-millis fields take the integer as it is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lapse.kernel.ledger.keys import InvalidEvent, InvalidOpKey, new_correlation_id, op_key, parse_op_key
from lapse.kernel.ledger.rows import LedgerRow

# Longest values the ledger columns hold (lapse/kernel/models.py).
FIELD_LIMITS = {"tenant": 64, "correlation_id": 64, "source": 16, "replay_id": 64}

# Where a consumed record came from: (topic, partition, offset).
Position = tuple[str, int, int]


def millis(ts: datetime) -> int:
    """Epoch milliseconds, as the records carry timestamps."""
    return int(ts.timestamp() * 1000)


# The fields every record and ledger row about one operation starts with.
IDENTITY = ("op_key", "kind", "tenant", "subject_id")


@dataclass(frozen=True, slots=True)
class ExpiryEvent:
    """One unit of cleanup work as carried on `lapse.expiry` (the Avro ExpiryEvent, decoded).

    Made by `expiry_event` (or `event_for_row`) when work is emitted, by `from_record` when a
    consumed record is decoded."""

    op_key: str
    kind: str
    tenant: str
    subject_id: str
    due_at: datetime
    correlation_id: str
    source: str
    attempt: int
    replay_id: str | None
    produced_at: datetime | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)

    def identity(self) -> dict[str, str]:
        """The fields every record and ledger row about this work starts with (`IDENTITY`)."""
        return {"op_key": self.op_key, "kind": self.kind, "tenant": self.tenant, "subject_id": self.subject_id}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ExpiryEvent:
        """Validate a decoded Avro record: the op key must be well formed and match kind/subject."""
        kind, subject = parse_op_key(record["op_key"])
        for name, limit in FIELD_LIMITS.items():
            value = record.get(name)
            if value is not None and not 0 < len(value) <= limit:
                raise InvalidEvent(f"{name} must be 1 to {limit} characters, got {len(value)}")
        if kind != record["kind"] or subject != record["subject_id"]:
            raise InvalidOpKey(
                f"op key {record['op_key'][:80]!r} does not match kind/subject_id of the event"
            )
        return cls(
            op_key=record["op_key"],
            kind=kind,
            tenant=record["tenant"],
            subject_id=subject,
            due_at=record["due_at"],
            correlation_id=record["correlation_id"],
            source=record["source"],
            attempt=record.get("attempt", 0),
            replay_id=record.get("replay_id"),
            produced_at=record.get("produced_at"),
            attributes=record.get("attributes") or {},
        )


def expiry_event(kind: str, subject_id: str | int, tenant: str, due_at: datetime, *, source: str,
                 correlation_id: str | None = None, attempt: int = 0,
                 replay_id: str | None = None) -> ExpiryEvent:
    """The event of one business operation: its op key from kind and subject (raises InvalidOpKey
    for a malformed one), a new correlation id unless one is carried over."""
    return ExpiryEvent(op_key=op_key(kind, subject_id), kind=kind, tenant=tenant,
                       subject_id=str(subject_id), due_at=due_at,
                       correlation_id=correlation_id or new_correlation_id(), source=source,
                       attempt=attempt, replay_id=replay_id)


def event_for_row(row: LedgerRow, *, source: str) -> ExpiryEvent:
    """The event that carries a ledger row's work again: its due time, attempt, replay id and
    correlation id as the row has them."""
    return ExpiryEvent(op_key=row.op_key, kind=row.kind, tenant=row.tenant, subject_id=row.subject_id,
                       due_at=row.due_at, correlation_id=row.correlation_id, source=source,
                       attempt=row.attempt, replay_id=row.replay_id)


def expiry_record(event: ExpiryEvent, produced_at: datetime) -> dict[str, Any]:
    """The expiry_event record of `event`, produced at `produced_at`."""
    return {
        **event.identity(),
        "due_at": millis(event.due_at),
        "produced_at": millis(produced_at),
        "source": event.source,
        "correlation_id": event.correlation_id,
        "attempt": event.attempt,
        "replay_id": event.replay_id,
        "attributes": dict(event.attributes),
    }


def outcome_record(event: ExpiryEvent, status: str, attempt: int, worker: str, at: datetime,
                   failure_class: str | None = None, reason: str | None = None) -> dict[str, Any]:
    """The cleanup_outcome record of a transition to `status` (the relay adds its `outcome_id`)."""
    return {
        **event.identity(),
        "status": status,
        "attempt": attempt,
        "failure_class": failure_class,
        "reason": reason,
        "due_at": millis(event.due_at),
        "occurred_at": millis(at),
        "correlation_id": event.correlation_id,
        "replay_id": event.replay_id,
        "worker": worker,
    }


@dataclass(frozen=True, slots=True)
class FailureEntry:
    """One failed attempt, as a dead letter's history lists it."""

    attempt: int
    failure_class: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Original:
    """A consumed record kept verbatim in a dead letter (poison: nothing else is known of it)."""

    key: bytes | None
    value: bytes | None
    headers: Mapping[str, bytes]


def dead_letter_record(failure_class: str, reason: str, attempt: int, at: datetime, *,
                       event: ExpiryEvent | None = None, history: Sequence[FailureEntry] = (),
                       position: Position | None = None, original: Original | None = None,
                       ) -> dict[str, Any]:
    """The dead_letter record: of an operation (`event`, with its failed attempts in `history`),
    or of a record no event could be decoded from (`original`)."""
    topic, partition, offset = position or ("", -1, -1)
    return {
        **(event.identity() if event else dict.fromkeys(IDENTITY)),
        "failure_class": failure_class,
        "reason": reason,
        "attempt": attempt,
        "history": [{"attempt": h.attempt, "failure_class": h.failure_class, "reason": h.reason,
                     "at": millis(h.at)} for h in history],
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "original_key": original.key if original else None,
        "original_value": original.value if original else None,
        "original_headers": dict(original.headers) if original else {},
        "dead_lettered_at": millis(at),
        "correlation_id": event.correlation_id if event else None,
        "replay_id": event.replay_id if event else None,
    }
