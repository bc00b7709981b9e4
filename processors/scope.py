"""One batch's scope: what every step of a batch works with (`BatchScope`), and what they report
(`BatchResult`); see docs/design/processing.md, "The batch scope".
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from lapse.kernel.brakes import Pauses, now_and_pauses
from lapse.kernel.clock import Clock, now_in
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent, LedgerWrites, Position
from lapse.kernel.topology import Topology


@dataclass
class BatchResult:
    """What one batch did, for the commit step, metrics and logs."""

    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    duplicates: int = 0
    conflicts: list[str] = field(default_factory=list)
    not_due: list[ExpiryEvent] = field(default_factory=list)
    leased: list[ExpiryEvent] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    rescheduled: list[str] = field(default_factory=list)  # still eligible, due later than thought
    backed_off: list[ExpiryEvent] = field(default_factory=list)  # due_at = the other lease's end
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)  # leased op key → its row's values
    attempts: dict[str, int] = field(default_factory=dict)  # leased op key → the attempt it runs (1-based)
    lost: list[str] = field(default_factory=list)  # leases another worker took over meanwhile
    held: list[str] = field(default_factory=list)  # parked by a brake: paused, undeclared, over budget
    shadowed: list[str] = field(default_factory=list)  # parked by a shadow-mode kind
    # Events whose tenant is not their business row's, with why: poison, no ledger row made for them.
    forged: list[tuple[ExpiryEvent, str]] = field(default_factory=list)

    def absorb(self, other: BatchResult) -> None:
        """Add another result's counts and keys to this one (results of one batch, split)."""
        for name, value in vars(other).items():
            mine = getattr(self, name)
            if isinstance(mine, list):
                mine.extend(value)
            elif isinstance(mine, dict):
                mine.update(value)
            else:
                setattr(self, name, mine + value)


@dataclass
class BatchScope:
    """One batch on one connection: its inputs, and the ledger writes and result of the
    transaction it is in."""

    conn: Connection
    kinds: Mapping[str, CleanupKind]
    topics: Topology
    worker: str
    now: datetime
    lease: timedelta
    positions: Mapping[str, Position] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    clock: Clock | None = None  # a test's settable now; None: the database's, read per transaction
    pauses: Pauses | None = None  # as read with the transaction's now (`begun`); None: not read yet
    writes: LedgerWrites = field(init=False)
    result: BatchResult = field(init=False, default_factory=BatchResult)
    # The op keys each budget (kind, tenant) let through in this transaction, held under its lock.
    charged: dict[tuple[str, str], set[str]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.writes = LedgerWrites(self.worker, self.now, self.topics.outcomes, self.positions)

    def fresh(self, now: datetime | None = None) -> BatchScope:
        """The same batch for another transaction (at `now`, if given): fresh writes and result."""
        return replace(self, now=self.now if now is None else now)

    def begun(self) -> BatchScope:
        """The same batch for the transaction just begun on `conn`, at its now (the database's,
        one small read, unless a clock is set): due, lease and deadline decisions use it. On
        PostgreSQL the same read brings the pauses (`now_and_pauses`), which the brakes then use."""
        if self.clock is None and self.conn.dialect.name == "postgresql":
            now, pauses = now_and_pauses(self.conn)
            return replace(self.fresh(now), pauses=pauses)
        return replace(self.fresh(now_in(self.conn, self.clock)), pauses=None)
