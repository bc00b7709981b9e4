"""Dead letters: poison written to lapse.dlq within a byte budget, and, for operators, listing
dead letters and replaying an explicit, bounded selection.

Poison is a record no ledger row can be made for (or whose dead letter the ledger could not
take): its dead letter carries the original key, value and headers clipped to a budget under the
producer's `message.max.bytes`, with the original lengths and SHA-256 in headers, so that a
record of any size the broker accepted can always be dead-lettered. A dead letter the DLQ still
refuses for its size or form is sent again without the original bytes.

A replay is one transaction: it picks at most `limit` dead-lettered rows matching the selection,
moves each dead_letter → pending under a new replay id (keeping the op key, so the effect still
happens at most once), resets the attempt count to 0 so the kind's full retry budget applies
again (the earlier attempts stay in ledger_transitions and travel in any later DLQ record's
history), records who, why and when as a transition, and puts the event back on lapse.expiry
through the outbox with source=replay. Rows that already went through a replay are left out
unless `include_replayed` is given, so a replayed failure returns to the dead letters and stays
there: nothing ever loops, and repeating a replay selects nothing new.

A discard is an operator's word that a dead letter will never be retried: one transaction moves
at most `limit` matching dead letters (replayed ones included) dead_letter → discarded, recording
who and why as each row's transition. A discarded row is final: no replay selects it, and a late
redelivery of its event is absorbed as a duplicate. It publishes nothing (no outcome: the
operation's last outcome stays its dead letter, and the transition and the operator action are
the record).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, replace
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaError, Producer
from sqlalchemy import Connection

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryFailed, DeliveryTracker, produce_or_refusal
from lapse.kernel.ledger import (
    DEAD_LETTER,
    DISCARDED,
    PENDING,
    ClippedOriginal,
    LedgerWrites,
    Original,
    OriginalBudget,
    Selection,
    clip_original,
    dead_letter_record,
    dead_letters,
    discard_dead_letters,
    event_for_row,
    release_dead_letters,
)
from lapse.kernel.logs import get_logger
from lapse.kernel.schema_names import DEAD_LETTER_RECORD
from lapse.processors.decode import Poison

SOURCE = "replay"
REASON_LIMIT = 2000  # characters of a dead letter's reason
log = get_logger("dead_letters")


def send_poison(producer: Producer, codec: Codec, delivery: DeliveryTracker, topic: str,
                items: list[Poison], now: datetime, budget: OriginalBudget) -> None:
    """Dead-letter `items` on `topic` as poison and wait until the broker has every one; logs
    each as dead-lettered only then. A dead letter refused for its own size or form goes again
    without the original bytes; raises DeliveryFailed when one is still not acknowledged (the
    caller commits nothing then)."""
    if not items:
        return
    refused: list[tuple[Poison, ClippedOriginal, str]] = []
    for item in items:
        _produce_poison(producer, codec, delivery, topic, item, clip_original(
            item.key, item.value, item.headers, budget), now, refused, keep_original=True)
    delivery.flush(producer)
    if refused:
        again, refused = refused, []
        for item, clipped, why in again:
            log.warning("dead letter refused by the DLQ, sent without the original bytes",
                        extra={"partition": item.partition, "offset": item.offset, "error": why})
            _produce_poison(producer, codec, delivery, topic, item, clipped, now, refused,
                            keep_original=False, refusal=why)
        delivery.flush(producer)
        if refused:
            raise DeliveryFailed(f"{len(refused)} dead letters refused even without the original "
                                 f"bytes, first: {refused[0][2]}", permanent=True)
    for item in items:
        log.warning("poison record dead-lettered", extra={
            "topic": item.topic, "partition": item.partition, "offset": item.offset,
            "reason": item.reason_code})


def _produce_poison(producer: Producer, codec: Codec, delivery: DeliveryTracker, topic: str,
                    item: Poison, clipped: ClippedOriginal, now: datetime,
                    refused: list[tuple[Poison, ClippedOriginal, str]], *, keep_original: bool,
                    refusal: str | None = None) -> None:
    """Queue one poison dead letter; a refusal for its size or form lands in `refused`."""
    reason = f"{item.reason_code}: {item.reason}"
    if refusal is not None:
        reason += f" (original bytes left out: the DLQ refused the dead letter: {refusal})"
    elif clipped.clipped:
        reason += f" (original {', '.join(clipped.clipped)} clipped to the dead letter's budget)"
    record = dead_letter_record(
        "poison", reason[:REASON_LIMIT], 0, now, position=(item.topic, item.partition, item.offset),
        original=clipped.original if keep_original else Original(None, None, {}))

    def on_refusal(err: KafkaError) -> None:
        refused.append((item, clipped, err.str()))

    err = produce_or_refusal(producer, topic, key=clipped.original.key if keep_original else None,
                             value=codec.encode(DEAD_LETTER_RECORD, record), headers=poison_headers(item, clipped),
                             on_delivery=delivery.or_refused(on_refusal))
    if err is not None:
        on_refusal(err)


def poison_headers(item: Poison, clipped: ClippedOriginal) -> list[tuple[str, bytes]]:
    """The headers of a poison dead letter: failure class, reason code, and the original key's
    and value's length and SHA-256 (hex) as they were before any clipping."""
    headers = [("failure_class", b"poison"), ("reason", item.reason_code.encode())]
    for part, length, digest in (("key", clipped.key_length, clipped.key_sha256),
                                 ("value", clipped.value_length, clipped.value_sha256)):
        if length is not None and digest is not None:
            headers += [(f"lapse-original-{part}-bytes", str(length).encode()),
                        (f"lapse-original-{part}-sha256", digest.encode())]
    if clipped.clipped:
        headers.append(("lapse-original-clipped", ",".join(clipped.clipped).encode()))
    return headers


def list_dead_letters(conn: Connection, selection: Selection, limit: int) -> list[dict[str, Any]]:
    """Dead letters matching `selection` (replayed ones included), oldest first, as plain dicts for
    the operator's table or JSON."""
    rows = dead_letters(conn, replace(selection, include_replayed=True), limit)
    return [asdict(row) for row in rows]


def replay(conn: Connection, selection: Selection, *, limit: int, reason: str, actor: str,
           now: datetime, expiry_topic: str) -> tuple[str, list[dict[str, Any]]]:
    """Release up to `limit` dead letters; returns (replay id, the rows released)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    replay_id = f"replay-{uuid.uuid4().hex[:12]}"
    rows = release_dead_letters(conn, selection, limit, replay_id, now)
    writes = LedgerWrites(actor, now)
    for row in rows:
        writes.transition(row.op_key, DEAD_LETTER, PENDING, row.attempt, reason=reason,
                          replay_id=replay_id, correlation_id=row.correlation_id)
        writes.expiry(expiry_topic, event_for_row(row, source=SOURCE), {"replay_id": replay_id})
    writes.flush(conn)
    released = [{"op_key": r.op_key, "kind": r.kind, "tenant": r.tenant, "subject_id": r.subject_id,
                 "last_failure_class": r.last_failure_class} for r in rows]
    return replay_id, released


def discard(conn: Connection, selection: Selection, *, limit: int, reason: str, actor: str,
            now: datetime) -> list[dict[str, Any]]:
    """Discard up to `limit` dead letters matching `selection` (replayed ones included); returns
    the rows discarded."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    rows = discard_dead_letters(conn, replace(selection, include_replayed=True), limit, now)
    writes = LedgerWrites(actor, now)
    for row in rows:
        writes.transition(row.op_key, DEAD_LETTER, DISCARDED, row.attempt, reason=reason,
                          replay_id=row.replay_id, correlation_id=row.correlation_id)
    writes.flush(conn)
    return [{"op_key": r.op_key, "kind": r.kind, "tenant": r.tenant, "subject_id": r.subject_id,
             "last_failure_class": r.last_failure_class} for r in rows]
