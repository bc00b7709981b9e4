"""Each bench stage runs in its own environment: a topic prefix of its own (so its topics and
consumer groups are its topology's, shared with no other stage), a fresh clone of the run's
database, and its own expiry topic holding its events, produced before the stage starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from lapse.devtools.bench.databases import BenchDatabases
from lapse.devtools.bench.events import create_expiry_topic, delete_topics, produce_events
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.settings import Settings


class StageEnvironments:
    """The environments of one run's stages; `close()` deletes every topic they created."""

    def __init__(self, base: Settings, dbs: BenchDatabases, partitions: int) -> None:
        self.base = base
        self.dbs = dbs
        self.partitions = partitions
        self.topics: list[str] = []

    def settings(self, stage: str) -> Settings:
        """The stage's settings without its database: the run's settings under the stage's prefix."""
        return self.base.with_(topics={"prefix": f"bench-{self.dbs.run_id}-{stage}."})

    @contextmanager
    def stage(self, stage: str, *, events: Sequence[ExpiryEvent] = (), expiry_topic: bool = True,
              batch_size: int | None = None) -> Iterator[Settings]:
        """The stage's settings on a fresh database (dropped afterwards); with `expiry_topic`, its
        expiry topic is created with the run's partition count and `events` are produced into it."""
        url = self.dbs.clone(stage)
        try:
            changes: dict[str, dict[str, Any]] = {"database": {"url": url}}
            if batch_size is not None:
                changes["processor"] = {"batch_size": batch_size}
            settings = self.settings(stage).with_(**changes)
            if expiry_topic:
                topic = create_expiry_topic(settings, self.partitions)
                self.topics.append(topic)
                if events:
                    produce_events(settings, topic, events, datetime.now(UTC))
            yield settings
        finally:
            self.dbs.drop(url)

    def close(self) -> None:
        delete_topics(self.base, self.topics)
        self.topics.clear()
