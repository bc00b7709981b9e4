"""The rotation of time partitions on PostgreSQL (the schemes and the catalog reads are
`lapse.kernel.ledger.partitions`): create the partitions ahead, drop old ones whole.

- Creating: `prune` creates, on every pass, the partitions from the current unit to `ahead` units
  past it that are missing. A new partition is created as a plain table LIKE its parent, the rows
  of its range that waited in DEFAULT are moved into it, and it is attached (ATTACH PARTITION takes
  SHARE UPDATE EXCLUSIVE on the parent, so inserts and updates go on, and ACCESS EXCLUSIVE on
  DEFAULT, taken first, for the move; it scans DEFAULT to prove it holds no row of the range, which
  is why DEFAULT is kept small: the outbox's DEFAULT has no index on created_at, so the move reads
  it too). Idempotent: a range that an existing partition overlaps is skipped.
- Both go through functions the tables' owner owns (migration 0011: `lapse_create_partition`,
  `lapse_drop_partition`, SECURITY DEFINER, their arguments checked inside), so the retention role
  needs EXECUTE on them, not the owner's rights; each partition belongs to the owner.
- Dropping: DETACH (plain: PostgreSQL refuses DETACH … CONCURRENTLY while a DEFAULT partition
  exists) and DROP in one short transaction under `lock_timeout`, so a long transaction on the
  table makes the pass skip the partition, instead of every writer queueing behind the ACCESS
  EXCLUSIVE lock. An outbox partition is re-probed for unsent rows once detached (nothing can write
  to it then) and kept when one appeared.
- Probes: an outbox partition holds an unsent row (`sent_at IS NULL … LIMIT 1`: its partial unsent
  index) and its newest send (`max(sent_at)`: the last entry of its partial sent index). Each is
  one index descent per partition, read through the outbox with the partition's range (so the
  outbox's own grants cover it: a partition prune creates carries none).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, Connection, func, select, text

from lapse.kernel.ledger.partitions import Partition, Scheme
from lapse.kernel.ledger.partitions import quoted_name as _q
from lapse.kernel.models import outbox as O

# A DDL statement waits at most this long for its lock, then the pass leaves that partition for the next one.
LOCK_TIMEOUT_MS = 2000
LOCK_NOT_AVAILABLE = "55P03"
DUPLICATE_TABLE = "42P07"


def missing_ahead(parts: list[Partition], scheme: Scheme, now: datetime) -> list[tuple[datetime, datetime]]:
    """The ranges from `now`'s unit to `ahead` units past it that no partition covers yet."""
    start = scheme.floor(now)
    ranges = [(start + k * scheme.unit, start + (k + 1) * scheme.unit) for k in range(scheme.ahead + 1)]
    bounded = [p for p in parts if not p.is_default]
    return [(lo, hi) for lo, hi in ranges
            if not any(p.lower < hi and lo < p.upper for p in bounded)]  # type: ignore[operator]


def _lock_timeout(conn: Connection) -> None:
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'"))


def lock_not_available(exc: BaseException) -> bool:
    """Whether a failed statement gave up waiting for its lock (lock_timeout)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == LOCK_NOT_AVAILABLE


def already_exists(exc: BaseException) -> bool:
    """Whether a failed statement found its table already there (another pass created it)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == DUPLICATE_TABLE


def create_partition(conn: Connection, scheme: Scheme, lower: datetime) -> int:
    """Create the partition of `scheme`'s table starting at `lower`, in the caller's transaction:
    the owner's `lapse_create_partition` makes it LIKE the parent, moves the range's rows in from
    DEFAULT and attaches it. Returns the rows moved."""
    _lock_timeout(conn)
    return int(conn.execute(text(f"SELECT {_q(conn, 'lapse_create_partition')}(:table, :lower)"),
                            {"table": scheme.name, "lower": lower}).scalar_one())


def _in_partition(partition: Partition) -> list[ColumnElement[bool]]:
    """An outbox partition's range: a statement on the outbox naming it reads that partition only."""
    return [O.c.created_at >= partition.lower, O.c.created_at < partition.upper]


def holds_unsent(conn: Connection, partition: Partition) -> bool:
    """Whether an outbox partition holds an unsent row (one probe of its partial unsent index)."""
    probe = select(O.c.id).where(O.c.sent_at.is_(None), *_in_partition(partition)).limit(1)
    return conn.execute(probe).first() is not None


def newest_send(conn: Connection, partition: Partition) -> datetime | None:
    """The latest `sent_at` in an outbox partition (the last entry of its partial sent index)."""
    return conn.execute(select(func.max(O.c.sent_at)).where(O.c.sent_at.is_not(None), *_in_partition(partition))
                        ).scalar()


def outbox_pin(conn: Connection, partition: Partition, cutoff: datetime) -> str | None:
    """Why an outbox partition older than the horizon must stay (None: it may go): an unsent row,
    or a row sent after `cutoff`."""
    if holds_unsent(conn, partition):
        return "holds unsent rows"
    sent = newest_send(conn, partition)
    if sent is not None and sent >= cutoff:
        return f"a row sent at {sent.isoformat()}, within the horizon"
    return None


def expired(parts: list[Partition], cutoff: datetime) -> list[Partition]:
    """The partitions whose every row is older than `cutoff` (upper bound at or before it); never DEFAULT."""
    return [p for p in parts if p.upper is not None and p.upper <= cutoff]


def drop_partition(conn: Connection, scheme: Scheme, partition: Partition) -> bool:
    """Detach and drop `partition`, in the caller's transaction, through the owner's
    `lapse_drop_partition`; an outbox partition holding an unsent row once detached is kept (False)."""
    _lock_timeout(conn)
    return bool(conn.execute(text(f"SELECT {_q(conn, 'lapse_drop_partition')}(:table, :partition)"),
                             {"table": scheme.name, "partition": partition.name}).scalar_one())
