"""The records about the ledger's work: expiry events (the work), cleanup outcomes (what happened)
and dead letters (what could not happen), with the one factory of expiry events, the one
validation of a consumed event, and the one serializer of each record type.

Serialized records carry timestamps as epoch milliseconds, so one dict fits both the outbox's JSON
column and the Avro codec (whose timestamp-millis fields take the integer as it is).

A consumed event is outside input: `ExpiryEvent.from_record` checks every field against what the
ledger columns, PostgreSQL and the retry arithmetic can hold (`FIELD_LIMITS`, `FORBIDDEN_CHARACTERS`,
`ATTEMPT_CAP`, the due-time window, `ATTRIBUTE_LIMITS`) and raises `InvalidField` naming each field
that fails, so nothing it lets through can fail further in.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

from lapse.kernel.ledger.keys import (
    MAX_OP_KEY,
    InvalidEvent,
    InvalidOpKey,
    new_correlation_id,
    op_key,
    op_key_names,
)
from lapse.kernel.ledger.rows import LedgerRow
from lapse.kernel.text import one_line

# Longest values (in characters) the ledger columns hold (lapse/kernel/models.py).
FIELD_LIMITS = {"op_key": MAX_OP_KEY, "kind": 64, "tenant": 64, "subject_id": 128, "correlation_id": 64,
                "source": 16, "replay_id": 64}
# Characters no text field may hold: C0 controls (NUL included, which PostgreSQL `text` rejects),
# DEL, C1 controls, and lone surrogates (not encodable in UTF-8, so not storable either).
FORBIDDEN_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# Most attempts an event may say were already made: far above any kind's `max_attempts` (which
# decoding checks when it knows the kind) and far below the ledger's INTEGER (2**31-1), so the
# retry arithmetic (`attempt + 1`) can never overflow a column.
ATTEMPT_CAP = 1_000
# The window a due time (and a production time) must fall in. Nothing Lapse cleans up lapsed
# before 2000, and nothing is planned more than 20 years ahead, longer than the retention windows
# Lapse is for; a value outside it is corrupt or hostile, and would make a row nobody claims.
EARLIEST_DUE = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_DUE_AHEAD = timedelta(days=20 * 366)
# Free-form attributes ride along on every wake-up and outcome: at most `count` of them, names and
# values at most that many characters, no forbidden characters.
ATTRIBUTE_LIMITS = {"count": 32, "name": 64, "value": 1024}

# The attributes of an event that carries none (immutable: it is every such event's default).
NO_ATTRIBUTES: Mapping[str, str] = MappingProxyType({})

_make_tuple = tuple.__new__

# Where a consumed record came from: (topic, partition, offset).
Position = tuple[str, int, int]


class InvalidField(InvalidEvent):
    """An event with fields no ledger row can hold; `fields` names each of them, and the message
    says what is wrong with each (`<field>: <problem>; …`)."""

    code = "invalid_field"

    def __init__(self, problems: Mapping[str, str]):
        super().__init__("; ".join(f"{name}: {problem}" for name, problem in problems.items()))
        self.fields = tuple(problems)


def millis(ts: datetime) -> int:
    """Epoch milliseconds, as the records carry timestamps."""
    return int(ts.timestamp() * 1000)


# The fields every record and ledger row about one operation starts with.
IDENTITY = ("op_key", "kind", "tenant", "subject_id")


class ExpiryEvent(NamedTuple):
    """One unit of cleanup work as carried on `lapse.expiry` (the Avro ExpiryEvent, decoded).

    Made by `expiry_event` (or `event_for_row`) when work is emitted, by `from_record` when a
    consumed record is decoded. A named tuple, not a frozen dataclass: as immutable, and made in
    a seventh of the time, which decoding's hot path pays once an event (docs/performance.md)."""

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
    attributes: Mapping[str, str] = NO_ATTRIBUTES
    # The operation's W3C trace context, carried in the records' `traceparent` header (not the body).
    traceparent: str | None = None

    @property
    def subject_key(self) -> str:
        """The subject as the op key names it: the subject id, with `@<generation>` for a kind that
        declares a generation column (what the kind's `parse_key` reads)."""
        return self.op_key.partition(":")[2]

    def identity(self) -> dict[str, str]:
        """The fields every record and ledger row about this work starts with (`IDENTITY`)."""
        return {"op_key": self.op_key, "kind": self.kind, "tenant": self.tenant, "subject_id": self.subject_id}

    @classmethod
    def from_record(cls, record: Mapping[str, Any], now: datetime | None = None,
                    traceparent: str | None = None) -> ExpiryEvent:
        """Validate a decoded Avro record (see the module docstring) and make its event, carrying
        `traceparent` (validated by the caller: `trace_context.traceparent_in`).

        Raises InvalidOpKey for an op key that is malformed or does not match kind/subject_id,
        InvalidField naming every other field that fails; `now` (default: the clock) places the
        due-time window."""
        key = record.get("op_key")
        if not isinstance(key, str):
            raise InvalidField({"op_key": _missing_or_type(key, "a string")})
        named = op_key_names(key)  # raises InvalidOpKey, saying why
        now = now or datetime.now(UTC)
        event = _plain_event(cls, record, key, named, latest_due(now), traceparent)  # the common case
        if event is not None:
            return event
        problems = field_problems(record, now)
        if problems:
            raise InvalidField(problems)
        kind, subject = record["kind"], record["subject_id"]
        if named != (kind, subject):  # a generation after the subject is the key's own
            raise InvalidOpKey(f"op key {one_line(key, 80, escape=True)!r} does not match kind/subject_id "
                               "of the event")
        attributes = record.get("attributes")
        return cls(key, kind, record["tenant"], subject, record["due_at"], record["correlation_id"], record["source"],
                   record.get("attempt", 0), record.get("replay_id"), record.get("produced_at"),
                   dict(attributes) if attributes else NO_ATTRIBUTES, traceparent)


# The latest due time accepted at the last `now` asked about: one addition a batch, not one an
# event (every event of a batch is decoded at the batch's `now`).
_latest_memo: tuple[datetime, datetime] = (EARLIEST_DUE, EARLIEST_DUE + LATEST_DUE_AHEAD)


def latest_due(now: datetime) -> datetime:
    """The latest due (and production) time an event decoded at `now` may carry."""
    global _latest_memo
    memo = _latest_memo
    if memo[0] is not now:
        memo = _latest_memo = (now, now + LATEST_DUE_AHEAD)
    return memo[1]


def _plain_event(cls: type[ExpiryEvent], record: Mapping[str, Any], key: str, named: tuple[str, str],
                 latest: datetime, traceparent: str | None) -> ExpiryEvent | None:
    """The event of `record`, made in one pass, when `field_problems` would find nothing and
    kind/subject_id are the ones its op key `key` names (`named`, so they are within their limits
    and their characters are the key's): every other text field a string within its limit
    (`FIELD_LIMITS`, spelled out), no forbidden character in any of them, both times aware and no
    later than `latest`, the attempt within its cap, no attributes. None says nothing: the caller
    asks `field_problems`, which names what is wrong. Decoding's hot path, written for speed: a
    value that is not a string fails the join."""
    get: Any = record.get  # values of any type: a wrong one fails the join below
    if get("kind") != named[0] or get("subject_id") != named[1] or get("attributes"):
        return None
    tenant, correlation, source, replay = get("tenant"), get("correlation_id"), get("source"), get("replay_id")
    try:
        texts = "".join((tenant, correlation, source, "" if replay is None else replay))
        if not (0 < len(tenant) <= 64 and 0 < len(correlation) <= 64 and 0 < len(source) <= 16
                and (replay is None or 0 < len(replay) <= 64)):
            return None
    except TypeError:
        return None
    # Printable text holds no forbidden character (each is a control or a surrogate), and the test
    # is a fraction of the search's cost; text that is not printable is searched.
    if not texts.isprintable() and FORBIDDEN_CHARACTERS.search(texts) is not None:
        return None
    due, produced, attempt = get("due_at"), get("produced_at"), get("attempt", 0)
    if type(due) is not datetime or due.tzinfo is None or not EARLIEST_DUE <= due <= latest:
        return None
    if produced is not None and (type(produced) is not datetime or produced.tzinfo is None
                                 or not EARLIEST_DUE <= produced <= latest):
        return None
    if type(attempt) is not int or not 0 <= attempt <= ATTEMPT_CAP:
        return None
    # Every field given: the tuple made directly, without the generated `__new__`'s call.
    return _make_tuple(cls, (key, named[0], tenant, named[1], due, correlation, source, attempt, replay, produced,
                             NO_ATTRIBUTES, traceparent))


def field_problems(record: Mapping[str, Any], now: datetime) -> dict[str, str]:
    """What is wrong with each field of an expiry event record (field → problem); empty when it
    fits the ledger. The op key's form and its match with kind/subject are `from_record`'s."""
    problems: dict[str, str | None] = {
        name: text_problem(record.get(name), limit, optional=name == "replay_id")
        for name, limit in FIELD_LIMITS.items()
    }
    problems["due_at"] = time_problem(record.get("due_at"), now)
    problems["produced_at"] = time_problem(record.get("produced_at"), now, optional=True)
    problems["attempt"] = attempt_problem(record.get("attempt", 0))
    problems["attributes"] = attributes_problem(record.get("attributes") or {})
    return {name: problem for name, problem in problems.items() if problem is not None}


def text_problem(value: Any, limit: int, *, optional: bool = False) -> str | None:
    """Why `value` cannot be a text field of at most `limit` characters, or None."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        return _missing_or_type(value, "a string")
    if not 0 < len(value) <= limit:
        return f"must be 1 to {limit} characters, got {len(value)}"
    return _forbidden_character(value)


def time_problem(value: Any, now: datetime, *, optional: bool = False) -> str | None:
    """Why `value` is not a timestamp within the window (`EARLIEST_DUE`, now + `LATEST_DUE_AHEAD`)."""
    if value is None and optional:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        return _missing_or_type(value, "a UTC timestamp")
    if value < EARLIEST_DUE:
        return f"{value.isoformat()} is before {EARLIEST_DUE.date().isoformat()}"
    if value > now + LATEST_DUE_AHEAD:
        return f"{value.isoformat()} is more than {LATEST_DUE_AHEAD.days // 366} years ahead"
    return None


def attempt_problem(value: Any) -> str | None:
    """Why `value` is not an attempt count from 0 to `ATTEMPT_CAP`, or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return _missing_or_type(value, "an integer")
    if not 0 <= value <= ATTEMPT_CAP:
        return f"must be 0 to {ATTEMPT_CAP}, got {value}"
    return None


def attributes_problem(value: Any) -> str | None:
    """Why `value` is not a map of attributes within `ATTRIBUTE_LIMITS`, or None."""
    if not isinstance(value, Mapping):
        return _missing_or_type(value, "a map of strings")
    if len(value) > ATTRIBUTE_LIMITS["count"]:
        return f"at most {ATTRIBUTE_LIMITS['count']} attributes, got {len(value)}"
    for name, text in value.items():
        problem = text_problem(name, ATTRIBUTE_LIMITS["name"])
        if problem is not None:
            return f"a name {problem}"
        if text != "":
            problem = text_problem(text, ATTRIBUTE_LIMITS["value"])
            if problem is not None:
                return f"the value of {name!r} {problem}"
    return None


def _forbidden_character(value: str) -> str | None:
    found = FORBIDDEN_CHARACTERS.search(value)
    if found is None:
        return None
    what = "lone surrogate" if "\ud800" <= found.group() <= "\udfff" else "control character"
    return f"contains the {what} U+{ord(found.group()):04X} at position {found.start()}"


def _missing_or_type(value: Any, expected: str) -> str:
    return "missing" if value is None else f"must be {expected}, got {type(value).__name__}"


def expiry_event(kind: str, subject_id: str | int, tenant: str, due_at: datetime, *, source: str,
                 correlation_id: str | None = None, attempt: int = 0,
                 replay_id: str | None = None, generation: str | None = None,
                 traceparent: str | None = None) -> ExpiryEvent:
    """The event of one business operation: its op key from kind, subject and generation (raises
    InvalidOpKey for a malformed one), a new correlation id unless one is carried over."""
    return ExpiryEvent(op_key=op_key(kind, subject_id, generation), kind=kind, tenant=tenant,
                       subject_id=str(subject_id), due_at=due_at,
                       correlation_id=correlation_id or new_correlation_id(), source=source,
                       attempt=attempt, replay_id=replay_id, traceparent=traceparent)


def event_for_row(row: LedgerRow, *, source: str, traceparent: str | None = None) -> ExpiryEvent:
    """The event that carries a ledger row's work again: its due time, attempt, replay id and
    correlation id as the row has them (and the trace context it was kept with, if any)."""
    return ExpiryEvent(op_key=row.op_key, kind=row.kind, tenant=row.tenant, subject_id=row.subject_id,
                       due_at=row.due_at, correlation_id=row.correlation_id, source=source,
                       attempt=row.attempt, replay_id=row.replay_id, traceparent=traceparent)


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
    """One failed attempt, as a dead letter's history lists it; `replay_id` tells the attempts of
    a replay from those before it (the retry policy's rate-limit deadline counts the current run)."""

    attempt: int
    failure_class: str
    reason: str
    at: datetime
    replay_id: str | None = None


@dataclass(frozen=True, slots=True)
class Original:
    """A consumed record kept verbatim in a dead letter (poison: nothing else is known of it)."""

    key: bytes | None
    value: bytes | None
    headers: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class OriginalBudget:
    """Bytes of a consumed record a dead letter may carry verbatim: its key, its value, and its
    headers (names and values together)."""

    key: int
    value: int
    headers: int

    @classmethod
    def under(cls, message_max_bytes: int) -> OriginalBudget:
        """A budget that keeps a whole dead letter safely under a producer's `message.max.bytes`:
        a quarter of it for the value, a sixteenth for the headers, 1/256 for the key (carried
        twice: the dead letter's own Kafka key is the original key too). The rest of a dead letter
        (reason, history, names) is a few KiB."""
        return cls(key=message_max_bytes // 256, value=message_max_bytes // 4, headers=message_max_bytes // 16)


@dataclass(frozen=True, slots=True)
class ClippedOriginal:
    """A consumed record cut to a budget, with the length and SHA-256 (hex) of its key and value as
    they were (None when it had none), and which parts were cut (`key`, `value`, `headers`)."""

    original: Original
    key_length: int | None
    key_sha256: str | None
    value_length: int | None
    value_sha256: str | None
    clipped: tuple[str, ...]


# Longest header name a dead letter keeps (characters).
HEADER_NAME_LIMIT = 256


def clip_original(key: bytes | None, value: bytes | None, headers: Sequence[tuple[Any, Any]],
                  budget: OriginalBudget) -> ClippedOriginal:
    """The consumed record (`headers` as the consumer returns them: (name, bytes or None) pairs, a
    repeated name's last value winning) cut to `budget`."""
    kept, headers_cut = _clip_headers(headers, budget.headers)
    clipped = tuple(name for name, cut in (("key", key is not None and len(key) > budget.key),
                                           ("value", value is not None and len(value) > budget.value),
                                           ("headers", headers_cut)) if cut)
    return ClippedOriginal(
        original=Original(None if key is None else key[:budget.key],
                          None if value is None else value[:budget.value], kept),
        key_length=None if key is None else len(key), key_sha256=_sha256(key),
        value_length=None if value is None else len(value), value_sha256=_sha256(value),
        clipped=clipped)


def _clip_headers(headers: Sequence[tuple[Any, Any]], budget: int) -> tuple[dict[str, bytes], bool]:
    last: dict[str, bytes] = {}
    for name, value in headers:
        text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value or b"")
        last[one_line(text, HEADER_NAME_LIMIT, escape=True)] = raw
    kept: dict[str, bytes] = {}
    left, cut = budget, len(headers) > len(last)
    for name, raw in last.items():
        cost = len(name.encode()) + len(raw)
        if cost > left:
            room = left - len(name.encode())
            if room > 0:
                kept[name] = raw[:room]
            return kept, True
        kept[name] = raw
        left -= cost
    return kept, cut


def _sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def dead_letter_record(failure_class: str, reason: str, attempt: int, at: datetime, *,
                       event: ExpiryEvent | None = None, history: Sequence[FailureEntry] = (),
                       position: Position | None = None, original: Original | None = None,
                       ) -> dict[str, Any]:
    """The dead_letter record: of an operation (`event`, with its failed attempts in `history`),
    or of a record no event could be decoded from (`original`, clipped by the caller)."""
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
