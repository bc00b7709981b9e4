"""The poison dead letters, read from the DLQ topic: records no ledger row could be made for, so
they exist only there (the ledger lists every other dead letter)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
from lapse.kernel.schema_names import DEAD_LETTER_RECORD
from lapse.kernel.settings import Settings
from lapse.readers import OffsetsError, read_to_end


@dataclass(frozen=True)
class PoisonLetter:
    """One poison dead letter: where it is on the DLQ, its record (decoded, or a stand-in saying it
    does not decode) and its Kafka headers (the reason code, the original's length and SHA-256)."""

    topic: str
    partition: int
    offset: int
    record: dict[str, Any]
    headers: dict[str, bytes]

    @property
    def reason_code(self) -> str:
        """The code of why it is poison (`unknown_fingerprint`, `bad_magic`, …): its `reason`
        header, else the start of its reason."""
        code = self.headers.get("reason")
        return code.decode("utf-8", "replace") if code else str(self.record.get("reason", "")).split(":", 1)[0]


def poison_letters(settings: Settings, codec: Codec) -> Iterator[PoisonLetter]:
    """The poison dead letters on the DLQ topic, oldest first per partition: read by manual
    assignment to partition EOF, each decoded with `codec` (one that does not decode comes as
    such). None when the DLQ topic is not there: nothing was ever dead-lettered as poison."""
    leave_connection_failures_to_caller()  # an unreachable broker is the error boundary's one line
    try:
        for msg in read_to_end(settings, settings.topology.dlq):
            try:
                record = codec.decode_expected(DEAD_LETTER_RECORD, msg.value() or b"")
            except DecodeError as exc:
                record = {"failure_class": "poison", "reason": f"dead letter does not decode: {exc}"}
            if record.get("failure_class") != "poison":
                continue  # an operation's dead letter: the ledger lists it
            headers = {name: value.encode() if isinstance(value, str) else value or b""
                       for name, value in dict(msg.headers() or []).items()}
            yield PoisonLetter(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0), record, headers)
    except OffsetsError:
        return


def poison_records(settings: Settings, kind: str | None, tenant: str | None, limit: int) -> list[dict[str, Any]]:
    """The poison dead letters on the DLQ topic (`poison_letters`) of `kind` and `tenant` when
    given, up to `limit`, as the operator's table shows them: positions and reasons only, never
    the original bytes."""
    found: list[dict[str, Any]] = []
    for letter in poison_letters(settings, Codec.from_settings(settings)):
        record = letter.record
        if (kind and record.get("kind") != kind) or (tenant and record.get("tenant") != tenant):
            continue
        at = record.get("dead_lettered_at")
        found.append({
            "poison": True, "op_key": record.get("op_key"), "kind": record.get("kind"),
            "tenant": record.get("tenant"), "subject_id": record.get("subject_id"),
            "attempt": record.get("attempt"),
            "last_failure_class": "poison", "last_failure": record.get("reason"), "replay_id": None,
            "finished_at": at.isoformat() if isinstance(at, datetime) else at,
            "source": {"topic": record.get("source_topic"), "partition": record.get("source_partition"),
                       "offset": record.get("source_offset")},
            "dlq": {"topic": letter.topic, "partition": letter.partition, "offset": letter.offset}})
        if len(found) >= limit:
            break
    return found
