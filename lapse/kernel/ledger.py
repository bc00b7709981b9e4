"""The ledger's vocabulary: states, op keys, and the decoded expiry event every room passes around."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime

PENDING = "pending"
CLAIMED = "claimed"
APPLIED = "applied"
SKIPPED = "skipped"
RETRY_SCHEDULED = "retry_scheduled"
DEAD_LETTER = "dead_letter"

STATES = (PENDING, CLAIMED, APPLIED, SKIPPED, RETRY_SCHEDULED, DEAD_LETTER)
TERMINAL = frozenset({APPLIED, SKIPPED, DEAD_LETTER})
WAITING = (PENDING, RETRY_SCHEDULED)

_KIND = r"[a-z][a-z0-9-]{0,62}"
_SUBJECT = r"[A-Za-z0-9._/-]{1,128}"
OP_KEY_RE = re.compile(rf"^(?P<kind>{_KIND}):(?P<subject>{_SUBJECT})$")


class InvalidEvent(ValueError):
    """An event no ledger row can be made for; `code` names the reason for the dead letter."""

    code = "invalid_field"


class InvalidOpKey(InvalidEvent):
    """An op key that is not `<kind>:<subject_id>`."""

    code = "malformed_op_key"


# Longest values the ledger columns hold (lapse/models.py).
FIELD_LIMITS = {"tenant": 64, "correlation_id": 64, "source": 16, "replay_id": 64}


def op_key(kind: str, subject_id: str | int) -> str:
    """The idempotency key of one business operation, e.g. `release-reservation:42`."""
    key = f"{kind}:{subject_id}"
    if not OP_KEY_RE.match(key):
        raise InvalidOpKey(f"malformed op key {key[:80]!r}: expected <kind>:<subject_id>")
    return key


def parse_op_key(key: str) -> tuple[str, str]:
    match = OP_KEY_RE.match(key)
    if not match:
        raise InvalidOpKey(f"malformed op key {key[:80]!r}: expected <kind>:<subject_id>")
    return match["kind"], match["subject"]


def new_correlation_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class ExpiryEvent:
    """One unit of cleanup work as carried on `lapse.expiry` (the Avro ExpiryEvent, decoded)."""

    op_key: str
    kind: str
    tenant: str
    subject_id: str
    due_at: datetime
    correlation_id: str
    source: str = "sweep"
    attempt: int = 0
    replay_id: str | None = None
    produced_at: datetime | None = None
    attributes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict) -> ExpiryEvent:
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

    def to_record(self, produced_at: datetime) -> dict:
        return {
            "op_key": self.op_key,
            "kind": self.kind,
            "tenant": self.tenant,
            "subject_id": self.subject_id,
            "due_at": self.due_at,
            "produced_at": produced_at,
            "source": self.source,
            "correlation_id": self.correlation_id,
            "attempt": self.attempt,
            "replay_id": self.replay_id,
            "attributes": dict(self.attributes),
        }
