"""Rewind a batch that failed for a reason outside its records, then wait the outage out.

The cleanup worker and the delay worker share this step: nothing of the batch was committed, so
each owned partition is sought back to the batch's first offset there and the batch comes again
after the outage's backoff. Work already made durable comes back as duplicates (absorbed by the
ledger and, for forwarded wake-ups, by the processor).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, Message, TopicPartition

from lapse.kernel.outages import Outage
from lapse.processors.decode import position_of


def first_offsets(messages: Iterable[Message]) -> dict[tuple[str, int], int]:
    """The lowest offset of each (topic, partition) among `messages`."""
    first: dict[tuple[str, int], int] = {}
    for msg in messages:
        topic, partition, offset = position_of(msg)
        first[(topic, partition)] = min(first.get((topic, partition), offset), offset)
    return first


def rewind_and_back_off(consumer: Consumer, owned: set[tuple[str, int]], messages: list[Message],
                        exc: BaseException, outage: Outage, stop: threading.Event, *,
                        release: Callable[[tuple[str, int]], None] | None = None) -> None:
    """Seek every owned partition of `messages` back to its first offset in the batch (calling
    `release(tp)` first, for a worker that paused it), then wait the outage's next backoff."""
    for tp, offset in first_offsets(messages).items():
        if tp in owned:
            if release is not None:
                release(tp)
            consumer.seek(TopicPartition(tp[0], tp[1], offset))
    outage.wait(exc, stop, records=len(messages))
