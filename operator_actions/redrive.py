"""Poison redrive: decode poison dead letters again with the current schemas and kinds, and send
what now decodes to the expiry topic under a redrive id, as an operator's recorded action.

A poison dead letter never got a ledger row, so a redrive makes one: in one transaction it creates
each sendable event's `pending` row (the claim: `INSERT … ON CONFLICT DO NOTHING`, so of two
redrives at once only one sends), records its transition, puts the event on the outbox (the relay
sends it) and records the operator action, whose details name every DLQ position sent. A later
redrive leaves out a position an earlier one sent, and an op key that has a ledger row: redriving
twice sends nothing twice, even after the ledger row was pruned. What still fails to decode is
left on the DLQ and reported with its new reason. Why this design: docs/operations.md, "Poison
redrive".
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine

from lapse.kernel.clock import database_now
from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import (
    PENDING,
    ExpiryEvent,
    InvalidEvent,
    LedgerWrites,
    Position,
    insert_pending,
    read_rows,
)
from lapse.kernel.settings import Settings
from lapse.operator_actions.poison import PoisonLetter, poison_letters
from lapse.operator_actions.record import REDRIVE, OperatorAction, details_of, log_action, record_action, session_user
from lapse.processors import decode_event

SOURCE = "redrive"


@dataclass(frozen=True)
class PoisonSelector:
    """Which poison dead letters a redrive takes: these DLQ positions (partition, offset), those
    of one reason code, or every one."""

    offsets: tuple[tuple[int, int], ...] = ()
    reason_code: str | None = None
    everything: bool = False

    def matches(self, letter: PoisonLetter) -> bool:
        if self.everything:
            return True
        if self.offsets:
            return (letter.partition, letter.offset) in self.offsets
        return letter.reason_code == self.reason_code

    def describe(self) -> str:
        """The selector in one line, as it is shown and recorded."""
        if self.everything:
            return "all poison"
        if self.offsets:
            return "offsets=" + ",".join(f"{p}:{o}" for p, o in self.offsets)
        return f"reason_code={self.reason_code}"


@dataclass(frozen=True)
class Examined:
    """One poison dead letter a redrive looked at: the event it now decodes to, or why it still
    fails (`code`, `reason`), or why it is not sent again (`skipped`)."""

    position: Position
    event: ExpiryEvent | None = None
    code: str | None = None
    reason: str | None = None
    skipped: str | None = None

    def shown(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"dlq": f"{self.position[1]}:{self.position[2]}"}
        if self.event is not None:
            entry["op_key"] = self.event.op_key
        return {**entry, **{k: v for k, v in (("code", self.code), ("reason", self.reason),
                                              ("skipped", self.skipped)) if v is not None}}


@dataclass
class RedrivePlan:
    """What a redrive of `selection` would do now: `sendable` (at most the limit), `fails`, `skipped`."""

    selection: str
    limit: int
    matching: int = 0
    sendable: list[Examined] = field(default_factory=list)
    fails: list[Examined] = field(default_factory=list)
    skipped: list[Examined] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"selection": self.selection, "limit": self.limit, "matching": self.matching,
                "sendable": [e.shown() for e in self.sendable], "fails": [e.shown() for e in self.fails],
                "skipped": [e.shown() for e in self.skipped]}


def original_value(letter: PoisonLetter) -> bytes:
    """The poison's original value as it was consumed; InvalidEvent when the dead letter does not
    keep it whole (none, clipped to the dead letter's budget, or not matching its SHA-256)."""
    value = letter.record.get("original_value")
    if not isinstance(value, bytes):
        raise InvalidEvent("the dead letter keeps no original value (it had none, or it was left out)")
    if "value" in letter.headers.get("lapse-original-clipped", b"").decode("ascii", "replace").split(","):
        raise InvalidEvent(f"the original value was clipped to {len(value)} bytes in the dead letter")
    digest = letter.headers.get("lapse-original-value-sha256")
    if digest is not None and hashlib.sha256(value).hexdigest() != digest.decode("ascii", "replace"):
        raise InvalidEvent("the original value does not match its SHA-256 in the dead letter's headers")
    return value


def plan_redrive(engine: Engine, settings: Settings, selector: PoisonSelector, limit: int) -> RedrivePlan:
    """Read the DLQ and decode each poison dead letter `selector` matches again, with the current
    schemas and kinds, as the processor would; nothing is written."""
    codec = Codec.from_settings(settings)
    kinds = load_kinds(settings, engine)
    plan = RedrivePlan(selector.describe(), limit)
    with engine.connect() as conn:
        now = database_now(conn)
        earlier = {tuple(entry["dlq"]): details.get("redrive_id") for details in details_of(conn, REDRIVE)
                   for entry in details.get("redriven", [])}
    decoded: list[Examined] = []
    for letter in poison_letters(settings, codec):
        if not selector.matches(letter):
            continue
        plan.matching += 1
        position = (letter.topic, letter.partition, letter.offset)
        if position in earlier:
            plan.skipped.append(Examined(position, skipped=f"redriven before by {earlier[position]}"))
        elif len(decoded) >= limit:
            continue  # counted, left for a later redrive
        else:
            try:
                decoded.append(Examined(position, event=decode_event(original_value(letter), codec, kinds, now)))
            except DecodeError as exc:
                if exc.transient:
                    raise  # the registry is away: an outage, not a verdict on the record
                plan.fails.append(Examined(position, code=exc.reason, reason=str(exc)))
            except InvalidEvent as exc:
                plan.fails.append(Examined(position, code=exc.code, reason=str(exc)))
    with engine.connect() as conn:
        rows = read_rows(conn, {e.event.op_key for e in decoded if e.event})
    for item in decoded:
        assert item.event is not None
        key = item.event.op_key
        if key in rows:
            plan.skipped.append(replace(item, skipped=f"already in the ledger ({rows[key].state})"))
        elif any(s.event and s.event.op_key == key for s in plan.sendable):
            plan.skipped.append(replace(item, skipped="the same op key as another dead letter sent"))
        else:
            plan.sendable.append(item)
    return plan


def run_redrive(engine: Engine, plan: RedrivePlan, *, reason: str, actor: str, expiry_topic: str,
                shown: int) -> dict[str, Any]:
    """Send the plan's sendable events in one transaction (each one's pending row, transition and
    outbox record, and the operator action), then log the action; an op key that got a ledger row
    since the plan is skipped. Returns the redrive id (None: nothing sent, nothing recorded), what
    was sent, failed or skipped, and the action's id."""
    redrive_id = f"redrive-{uuid.uuid4().hex[:12]}"
    sent: list[Examined] = []
    skipped = list(plan.skipped)
    recorded = None
    with engine.begin() as conn:
        now = database_now(conn)
        events = {e.position: e.event._replace(source=SOURCE, replay_id=redrive_id) for e in plan.sendable if e.event}
        created = set(insert_pending(conn, list(events.values()), now))
        writes = LedgerWrites(actor, now)
        for item in plan.sendable:
            event = events[item.position]
            if event.op_key not in created:
                skipped.append(replace(item, skipped="already in the ledger"))
                continue
            writes.transition(event.op_key, None, PENDING, event.attempt, reason=reason, replay_id=redrive_id,
                              correlation_id=event.correlation_id, position=item.position)
            writes.expiry(expiry_topic, event, {"replay_id": redrive_id})
            sent.append(item)
        writes.flush(conn)
        if sent:
            details = {"redrive_id": redrive_id, "sent": len(sent), "limit": plan.limit,
                       "shown_before_confirming": shown, "op_keys": [events[e.position].op_key for e in sent],
                       "redriven": [{"dlq": list(e.position), "op_key": events[e.position].op_key} for e in sent],
                       "still_failing": [e.shown() for e in plan.fails]}
            recorded = record_action(conn, OperatorAction(REDRIVE, actor, reason, plan.selection, details), now,
                                     session_user(conn))
    if recorded is not None:
        log_action(recorded)
    return {"redrive_id": redrive_id if recorded else None, "selection": plan.selection, "matching": plan.matching,
            "sent": [e.shown() for e in sent], "fails": [e.shown() for e in plan.fails],
            "skipped": [e.shown() for e in skipped], "action_id": recorded.id if recorded else None}
