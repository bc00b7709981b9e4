"""The rotation of time partitions on PostgreSQL (the schemes and the catalog reads are
`lapse.kernel.ledger.partitions`): create the partitions ahead, drop old ones whole.

- Creating: `prune` creates, on every pass, the partitions from the current unit to `ahead` units
  past it that are missing. A new partition is created as a plain table LIKE its parent, the rows
  of its range that waited in DEFAULT are moved into it, and it is attached (ATTACH PARTITION takes
  SHARE UPDATE EXCLUSIVE on the parent, so inserts and updates go on, and ACCESS EXCLUSIVE on
  DEFAULT, taken first, for the move; it scans DEFAULT to prove it holds no row of the range, which
  is why DEFAULT is kept small: the outbox's DEFAULT has no index on created_at, so the move reads
  it too). Idempotent: a range that an existing partition overlaps is skipped.
- Dropping: DETACH (plain: PostgreSQL refuses DETACH … CONCURRENTLY while a DEFAULT partition
  exists) and DROP in one short transaction under `lock_timeout`, so a long transaction on the
  table makes the pass skip the partition, instead of every writer queueing behind the ACCESS
  EXCLUSIVE lock. An outbox partition is re-probed for unsent rows once detached (nothing can write
  to it then) and kept when one appeared.
- Probes: an outbox partition holds an unsent row (`sent_at IS NULL … LIMIT 1`: its partial unsent
  index) and its newest send (`max(sent_at)`: the last entry of its partial sent index). Each is
  one index descent per partition.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Connection, text

from lapse.kernel.ledger.partitions import OUTBOX, Partition, Scheme
from lapse.kernel.ledger.partitions import quoted_name as _q

# A DDL statement waits at most this long for its lock, then the pass leaves that partition for the next one.
LOCK_TIMEOUT_MS = 2000
LOCK_NOT_AVAILABLE = "55P03"
DUPLICATE_TABLE = "42P07"


def _literal(at: datetime) -> str:
    return f"'{at.astimezone(UTC):%Y-%m-%d %H:%M:%S}+00'"


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


def create_partition(conn: Connection, scheme: Scheme, lower: datetime, upper: datetime) -> int:
    """Create the partition [lower, upper) of `scheme`'s table, in the caller's transaction: a table
    LIKE the parent, the range's rows moved into it from DEFAULT, attached. Returns the rows moved."""
    _lock_timeout(conn)
    parent, default, new = _q(conn, scheme.name), _q(conn, scheme.default_name), _q(conn, scheme.partition_name(lower))
    key = conn.dialect.identifier_preparer.quote(scheme.key)
    # ATTACH takes this lock anyway; taken first, no row of the range can reach DEFAULT between
    # the move and the attach (which would fail it). Inserts routed elsewhere never wait for it.
    conn.execute(text(f"LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE"))
    conn.execute(text(f"CREATE TABLE {new} (LIKE {parent} INCLUDING CONSTRAINTS INCLUDING GENERATED)"))
    _owned_like_parent(conn, new, parent)
    moved = conn.execute(text(
        f"WITH moved AS (DELETE FROM {default} WHERE {key} >= {_literal(lower)} AND {key} < {_literal(upper)} "
        f"RETURNING *) INSERT INTO {new} SELECT * FROM moved")).rowcount
    conn.execute(text(f"ALTER TABLE {parent} ATTACH PARTITION {new} "
                      f"FOR VALUES FROM ({_literal(lower)}) TO ({_literal(upper)})"))
    name_partition_indexes(conn, scheme, scheme.partition_name(lower))
    return moved


def _owned_like_parent(conn: Connection, table: str, parent: str) -> None:
    """Give a partition its parent's owner when a member of that role created it (compose's prune
    role): every partition then belongs to whoever migrates the tables, as the first ones do."""
    owner, me = conn.execute(text("SELECT pg_get_userbyid(relowner), current_user FROM pg_class "
                                  "WHERE oid = CAST(:parent AS regclass)"), {"parent": parent}).one()
    if owner != me:
        conn.execute(text(f"ALTER TABLE {table} OWNER TO {conn.dialect.identifier_preparer.quote(owner)}"))


def name_partition_indexes(conn: Connection, scheme: Scheme, partition: str) -> None:
    """Name the indexes ATTACH made on `partition` after their parent's (ix_lapse_outbox_unsent_p20261130),
    as migration 0009 names the first ones, so plans read plainly."""
    found = conn.execute(text(
        "SELECT ci.relname, pi.relname FROM pg_index x JOIN pg_class ci ON ci.oid = x.indexrelid "
        "JOIN pg_inherits i ON i.inhrelid = ci.oid JOIN pg_class pi ON pi.oid = i.inhparent "
        "WHERE x.indrelid = CAST(:partition AS regclass)"), {"partition": _q(conn, partition)}).all()
    suffix = partition.removeprefix(scheme.name)
    preparer = conn.dialect.identifier_preparer
    for child, parent in found:
        if child != parent + suffix:
            conn.execute(text(f"ALTER INDEX {_q(conn, child)} RENAME TO {preparer.quote(parent + suffix)}"))


def holds_unsent(conn: Connection, partition: Partition) -> bool:
    """Whether an outbox partition holds an unsent row (one probe of its partial unsent index)."""
    probe = text(f"SELECT 1 FROM {_q(conn, partition.name)} WHERE sent_at IS NULL LIMIT 1")
    return conn.execute(probe).first() is not None


def newest_send(conn: Connection, partition: Partition) -> datetime | None:
    """The latest `sent_at` in an outbox partition (the last entry of its partial sent index)."""
    return conn.execute(text(f"SELECT max(sent_at) FROM {_q(conn, partition.name)} WHERE sent_at IS NOT NULL")).scalar()


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
    """Detach and drop `partition`, in the caller's transaction; an outbox partition is probed again
    once detached and kept (False) when it holds an unsent row."""
    _lock_timeout(conn)
    table = _q(conn, partition.name)
    conn.execute(text(f"ALTER TABLE {_q(conn, scheme.name)} DETACH PARTITION {table}"))
    if scheme is OUTBOX and holds_unsent(conn, partition):
        return False
    conn.execute(text(f"DROP TABLE {table}"))
    return True
