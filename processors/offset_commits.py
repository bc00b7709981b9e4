"""Offsets a worker commits without waiting, kept until the broker accepts them.

A commit sent without waiting is refused while the group coordinator moves (a broker killed or
restarted); dropped, its partitions' work would be delivered again to whoever reads them next.
So each offset stays pending until acknowledged: every commit sends all pending offsets of the
partitions still owned, merged (the newest per partition), and the worker sends them again
between batches until they are accepted (`due`); while they are refused or unanswered
(`stalled`), the worker holds its next batch back, so that a rebalance after a coordinator's death
delivers again at most the batches done since the last accepted commit. A revoked or lost
partition's pending offsets are forgotten, never sent while another member owns it; if a lost
partition is given back, the work done for it before is durable, so its offset is committed then,
forward only (never below the group's), before anything is read from it again. Commits sent while
the coordinator moves may reach the new one out of order, an older after a newer, and the broker
keeps the last it wrote: an acceptance older than one accepted before sends the newer again
(`accepted`). Why it is safe: docs/design/processing.md, "The commit order".
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from confluent_kafka import KafkaError, TopicPartition

# How long a commit may stay unanswered before the worker sends its offsets again.
RESEND_AFTER_S = 0.5
# How long offsets may wait for their acceptance before the worker holds its next batch back.
STALLED_AFTER_S = 1.0


class PendingCommits:
    """The offsets (next offset to read, per partition) sent and not yet acknowledged."""

    def __init__(self, resend_after_s: float = RESEND_AFTER_S) -> None:
        self.offsets: dict[tuple[str, int], int] = {}
        self.resend_after_s = resend_after_s
        self.sent_at = float("-inf")
        self.unanswered: deque[float] = deque()  # when each commit still unanswered was sent
        self.refused_since: float | None = None  # refused ever since (an acceptance ends it)
        self.refused = 0  # commits the broker refused, for logs and tests
        # Next offsets of work done for partitions lost before their commit was accepted: if the
        # group gives one back, its offset is committed then (`set_aside`, `given_back`).
        self.aside: dict[tuple[str, int], int] = {}
        # The newest offset the broker accepted per owned partition: an older one accepted after it
        # moved the group's offset back.
        self.acknowledged: dict[tuple[str, int], int] = {}
        self.moved_back = 0  # acceptances that put a partition's offset back, for logs and tests

    def merge(self, offsets: Iterable[TopicPartition]) -> None:
        """Add a batch's offsets (the newest per partition wins)."""
        for tp in offsets:
            key = (tp.topic, tp.partition)
            self.offsets[key] = max(self.offsets.get(key, -1), tp.offset)

    def to_send(self, owned: set[tuple[str, int]]) -> list[TopicPartition]:
        """Every pending offset of a partition in `owned`, stamped as sent now (and awaiting its
        answer, if there is any to send)."""
        self.sent_at = time.monotonic()
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(self.offsets.items()) if (t, p) in owned]
        if offsets:
            self.unanswered.append(self.sent_at)
        return offsets

    def due(self) -> bool:
        """Whether offsets wait whose last commit has gone unanswered or was refused for a while."""
        return bool(self.offsets) and time.monotonic() - self.sent_at >= self.resend_after_s

    def stalled(self, after_s: float = STALLED_AFTER_S) -> bool:
        """Whether commits are refused, or have gone unanswered for `after_s`: the worker then holds
        its next batch back (what it did meanwhile would be delivered again if the group rebalanced)."""
        return bool(self.offsets) and (self.refused_since is not None or (
            bool(self.unanswered) and time.monotonic() - self.unanswered[0] >= after_s))

    def answered(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The broker's answer to a commit sent without waiting (the oldest unanswered one)."""
        if self.unanswered:
            self.unanswered.popleft()
        if err is not None:  # all stay pending, sent again once `resend_after_s` has passed
            self.refused += 1
            self.refused_since = self.refused_since or time.monotonic()
            return
        self.refused_since = None
        self.accepted(partitions)

    def accepted(self, partitions: list[TopicPartition]) -> None:
        """Offsets the broker accepted: each partition drops what they covered. An offset older than
        one accepted before (a commit sent earlier, written later) put the group's offset back: the
        newer one is pending again."""
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if tp.error is not None:
                continue
            newest = self.acknowledged.get(key, -1)
            if tp.offset < newest:
                self.offsets[key] = max(self.offsets.get(key, -1), newest)
                self.moved_back += 1
                continue
            self.acknowledged[key] = tp.offset
            if self.offsets.get(key, tp.offset + 1) <= tp.offset:
                del self.offsets[key]
        self._settle()

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions given up: their offsets must never be sent again (the next owner commits its own)."""
        for key in partitions:
            self.offsets.pop(key, None)
            self.acknowledged.pop(key, None)
        self._settle()

    def _settle(self) -> None:
        if not self.offsets:
            self.refused_since = None

    def set_aside(self, done: dict[tuple[str, int], int]) -> None:
        """Keep the next offsets of work done for partitions lost with their commits unaccepted."""
        self.aside.update(done)

    def given_back(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The offsets set aside for `partitions`, now assigned again (and no longer set aside)."""
        return {tp: self.aside.pop(tp) for tp in partitions if tp in self.aside}
