"""What `lapse dlq` and the console share about dead letters: the poison records, read from the
DLQ topic (they have no ledger row), how a replay's selection is shown and recorded, and the
discard (its dry run, and the discard with its operator action). `lapse dlq` imports this module
at start-up, so what it needs beyond that is imported where it is used."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy import Engine

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
    from lapse.readers import OffsetsError, read_to_end

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


def discard_selection(kind: str | None = None, tenant: str | None = None, op_keys: tuple[str, ...] = ()
                      ) -> Selection:
    """The dead letters a discard names; replayed ones are included (a discard never loops)."""
    from lapse.kernel.ledger import Selection  # function-local: keeps `lapse --help` fast

    return Selection(kind, tenant, tuple(sorted(set(op_keys))), include_replayed=True)


def discard_preview(engine: Engine, selection: Selection, limit: int) -> dict[str, Any]:
    """The dry run: which dead letters of `selection` a discard would take now (at most `limit`)."""
    from lapse.kernel.ledger import dead_letters  # function-local: keeps `lapse --help` fast

    with engine.connect() as conn:
        matching = [row.op_key for row in dead_letters(conn, selection, limit)]
    return {"selection": describe_selection(selection), "would_discard": len(matching), "op_keys": matching,
            "limit": limit}


def run_discard(engine: Engine, selection: Selection, *, limit: int, actor: str, reason: str, shown: int,
                now: datetime, via: str | None = None) -> dict[str, Any]:
    """Discard up to `limit` dead letters of `selection` and record the operator action in the same
    transaction, then log it; returns the rows discarded and the action's id (None: nothing matched
    any more, nothing recorded)."""
    # function-local: keeps `lapse --help` fast
    from lapse.operator_actions import DISCARD, OperatorAction, discard, log_action, record_action, session_user

    recorded = None
    with engine.begin() as conn:
        db_user = session_user(conn)
        discarded = discard(conn, selection, limit=limit, reason=reason, actor=actor, now=now)
        if discarded:
            details: dict[str, Any] = {"discarded": len(discarded), "limit": limit, "shown_before_confirming": shown,
                                       "op_keys": [r["op_key"] for r in discarded]}
            if via:
                details["via"] = via
            recorded = record_action(conn, OperatorAction(DISCARD, actor, reason, describe_selection(selection),
                                                          details), now, db_user)
    if recorded is not None:
        log_action(recorded)
    return {"discarded": discarded, "action_id": recorded.id if recorded else None}
