"""The poison dead letters, read from the DLQ topic: records no ledger row could be made for, so
they exist only there (the ledger lists every other dead letter)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
from lapse.kernel.schema_names import DEAD_LETTER_RECORD
from lapse.kernel.settings import Settings
from lapse.readers import OffsetsError, read_to_end


def poison_records(settings: Settings, kind: str | None, tenant: str | None, limit: int) -> list[dict[str, Any]]:
    """The poison dead letters on the DLQ topic, oldest first per partition, up to `limit`: records
    no ledger row could be made for, so they exist only there. Read by manual assignment to
    partition EOF; each is decoded with the codec (one that does not decode is listed as such).
    Positions and reasons only, never the original bytes."""
    leave_connection_failures_to_caller()  # an unreachable broker is the error boundary's one line
    codec = Codec.from_settings(settings)
    found: list[dict[str, Any]] = []
    try:
        for msg in read_to_end(settings, settings.topology.dlq):
            try:
                record = codec.decode_expected(DEAD_LETTER_RECORD, msg.value() or b"")
            except DecodeError as exc:
                record = {"failure_class": "poison", "reason": f"dead letter does not decode: {exc}"}
            if record.get("failure_class") != "poison":
                continue  # an operation's dead letter: the ledger lists it
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
                "dlq": {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()}})
            if len(found) >= limit:
                break
    except OffsetsError:  # the DLQ topic is not there: nothing was ever dead-lettered as poison
        return []
    return found
