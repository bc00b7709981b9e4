"""What `lapse dlq` and the console share about dead letters: the poison records, read from the
DLQ topic (they have no ledger row), and how a replay's selection is shown and recorded. `lapse
dlq` imports this module at start-up, so what it needs beyond that is imported where it is used."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lapse.kernel.ledger import Selection
    from lapse.kernel.settings import Settings


def poison_records(settings: Settings, kind: str | None, tenant: str | None, limit: int) -> list[dict[str, Any]]:
    """The poison dead letters on the DLQ topic, oldest first per partition, up to `limit`: records
    no ledger row could be made for, so they exist only there. Read by manual assignment to
    partition EOF; each is decoded with the codec (one that does not decode is listed as such).
    Positions and reasons only, never the original bytes."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.codec import Codec, DecodeError
    from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
    from lapse.readers.offsets import OffsetsError, read_to_end

    leave_connection_failures_to_caller()  # an unreachable broker is the error boundary's one line
    codec = Codec.from_settings(settings)
    found: list[dict[str, Any]] = []
    try:
        for msg in read_to_end(settings, settings.topology.dlq):
            try:
                record = codec.decode_expected("dead_letter", msg.value() or b"")
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


def describe_selection(selection: Selection) -> str:
    """The selection in one line, as it is shown and recorded: `all` or its terms."""
    terms = [f"{name}={value}" for name, value in (("kind", selection.kind), ("tenant", selection.tenant))
             if value]
    if selection.op_keys:
        terms.append("op_keys=" + ",".join(selection.op_keys))
    text = " ".join(terms) or "all"
    return text + (" (replayed ones included)" if selection.include_replayed else "")
