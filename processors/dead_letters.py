"""Dead letters of poison: written to lapse.dlq within a byte budget. (Listing, replaying and
discarding dead letters is what an operator does: lapse.operator_actions.)

Poison is a record no ledger row can be made for (or whose dead letter the ledger could not
take): its dead letter carries the original key, value and headers clipped to a budget under the
producer's `message.max.bytes`, with the original lengths and SHA-256 in headers, so that a
record of any size the broker accepted can always be dead-lettered. A dead letter the DLQ still
refuses for its size or form is sent again without the original bytes.
"""

from __future__ import annotations

from datetime import datetime

from confluent_kafka import KafkaError, Producer

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryFailed, DeliveryTracker, produce_or_refusal
from lapse.kernel.ledger import (
    ClippedOriginal,
    Original,
    OriginalBudget,
    clip_original,
    dead_letter_record,
)
from lapse.kernel.logs import get_logger
from lapse.processors.decode import Poison

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
                             value=codec.encode("dead_letter", record), headers=poison_headers(item, clipped),
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
