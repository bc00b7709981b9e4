"""Time partitions on PostgreSQL: lapse_transitions by `at` (weekly), lapse_outbox by `created_at`
(daily), declarative range partitioning, so retention drops whole old partitions instead of deleting
rows one by one (no dead tuples, no vacuum debt, no index bloat for the history that goes).

Why these keys and widths:
- The outbox is written and read hot and kept a short time (`retention.outbox_horizon_s`, 1 day):
  daily partitions keep at most about two days of sent rows. A partition goes when its upper bound
  is older than the horizon, it holds no unsent row (a probe of its partial unsent index) and its
  newest send is older than the horizon (a probe of its sent index): an unsent row pins its day.
- Transitions are history, kept `retention.history_horizon_s` (default: the dead-letter horizon, 90
  days with the packaged topics.yaml): weekly partitions mean about 14 partitions to look through
  for the reads by op key (`lapse show`, a dead letter's failures), at the price of keeping up to a
  week more than the horizon (8%). Daily ones would be about 95 index probes per read by key.
  A partition goes by age alone: the transitions older than the history horizon of a ledger row
  still kept go with it (an operation unfinished that long, the first attempts of a long-failing
  dead letter; lapse.retention.horizons says what that gives up). A rule pinning such partitions
  would have to probe every transition in them against the ledger, the row-by-row walk this
  replaces; the history horizon is the knob instead, defaulting to the longest the ledger keeps.
- The partition key must be part of the primary key: (id, at) and (id, created_at). The id stays
  unique: it comes from the same sequence, which continues where it was.
- Each table also gets a DEFAULT partition, so an insert never fails for want of a partition (a row
  timestamped before the oldest partition or past the newest, e.g. a test's or a skewed clock's).
  `lapse prune` creates the partitions ahead of time (a week and more) on every pass, moves rows
  that wait in DEFAULT into a partition created for their range, deletes DEFAULT's old rows in
  batches and says how many rows it holds. A DEFAULT partition rules out DETACH … CONCURRENTLY
  (PostgreSQL refuses it then), so prune detaches with a plain DETACH under a short lock_timeout
  (the ACCESS EXCLUSIVE lock on the parent is held for milliseconds; if a long transaction holds
  the table the pass gives up on that partition and tries again on the next pass, instead of
  queueing every writer behind it).

The conversion happens in place, in this migration's transaction (writers wait while the rows are
copied: 8.8 s for 1,000,000 transitions and 300,000 outbox rows here): the table is renamed, a
partitioned table is created LIKE it (so every column it has now, whatever earlier revisions added,
is carried over with its type, NOT NULL and default: the id default still draws from the same
sequence), partitions cover the existing rows' range (the unit's partitions from the oldest row to a
week ahead, at most 64, older rows sharing one wide first partition) and a DEFAULT one, the rows are
copied, the table's indexes are re-created on the partitioned table from their own definitions (so
every index is carried over, partitioned: each partition gets its own, named after it:
ix_lapse_outbox_unsent_p20261130), the sequence is handed to the new table and the old one dropped.
Everything is plain SQL (DO blocks for the index loops), so `lapse db upgrade --sql` prints it too;
offline there are no rows, so the partitions start today. SQLite: nothing (it has no partitioning;
its prune keeps deleting in batches). Downgrade: back to plain tables, every row kept.

Revision ID: 0009
Revises: 0008
"""
from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from itertools import pairwise

import sqlalchemy as sa
from alembic import context, op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Frozen here (lapse.kernel.ledger.partitions has the living copy): table, key, unit in days,
# partitions made ahead of today.
TABLES = (("lapse_transitions", "at", 7, 2), ("lapse_outbox", "created_at", 1, 7))
MAX_PARTITIONS = 64


def _floor(day: date, unit_days: int) -> date:
    """The start of the unit holding `day`: the day itself, or its ISO week's Monday."""
    return day - timedelta(days=day.weekday()) if unit_days == 7 else day


def _bounds(oldest: datetime | None, newest: datetime | None, unit_days: int, ahead: int,
            today: date) -> list[date]:
    """Partition boundaries: from the oldest row's unit to `ahead` units past today's (and past the
    newest row's, within MAX_PARTITIONS), the oldest ones merged into one when there are too many."""
    unit = timedelta(days=unit_days)
    first = _floor(today, unit_days)
    last = first + (ahead + 1) * unit
    if newest is not None:
        last = min(max(last, _floor(newest.astimezone(UTC).date(), unit_days) + unit), first + MAX_PARTITIONS * unit)
    start = first if oldest is None else min(first, _floor(oldest.astimezone(UTC).date(), unit_days))
    bounds = [start]
    while bounds[-1] < last:
        bounds.append(bounds[-1] + unit)
    if len(bounds) - 1 > MAX_PARTITIONS:
        bounds = [bounds[0], *bounds[len(bounds) - MAX_PARTITIONS:]]
    return bounds


def _ts(day: date) -> str:
    return f"'{day.isoformat()} 00:00:00+00'"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _saved(table: str) -> str:
    return _q(f"lapse_0009_{table}_indexes")


def _save_and_drop_indexes(schema: str, table: str) -> None:
    """Keep the definitions of `table`'s indexes (not its primary key) in a temporary table, then
    drop them: the new table's get the same names."""
    qualified = f"{_q(schema)}.{_q(table)}"
    op.execute(f"CREATE TEMPORARY TABLE {_saved(table)} AS "
               "SELECT c.relname AS name, pg_get_indexdef(i.indexrelid) AS definition "
               "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
               f"WHERE i.indrelid = '{qualified}'::regclass AND NOT i.indisprimary")
    op.execute(f"DO $$ DECLARE r record; BEGIN FOR r IN SELECT name FROM {_saved(table)} LOOP "
               f"EXECUTE format('DROP INDEX %I.%I', '{schema}', r.name); END LOOP; END $$")


def _recreate_indexes(schema: str, table: str) -> None:
    """The saved definitions run again: on the table of the same name now. A partitioned index
    prints as `ON ONLY table`; on a plain table (the downgrade) that becomes `ON table`."""
    op.execute(f"DO $$ DECLARE r record; BEGIN FOR r IN SELECT definition FROM {_saved(table)} LOOP "
               "EXECUTE replace(r.definition, ' ON ONLY ', ' ON '); END LOOP; END $$")
    op.execute(f"DROP TABLE {_saved(table)}")


def _name_partition_indexes(schema: str, table: str) -> None:
    """Name each partition's index after its parent's and the partition (ix_lapse_outbox_unsent_p20261130,
    pk_lapse_outbox_default) instead of PostgreSQL's made-up names, so plans read plainly."""
    op.execute(
        "DO $$ DECLARE r record; BEGIN FOR r IN "
        "SELECT ci.relname AS child, pi.relname AS parent, pt.relname AS part FROM pg_inherits i "
        "JOIN pg_class ci ON ci.oid = i.inhrelid JOIN pg_class pi ON pi.oid = i.inhparent "
        "JOIN pg_index x ON x.indexrelid = ci.oid JOIN pg_class pt ON pt.oid = x.indrelid "
        f"JOIN pg_index px ON px.indexrelid = pi.oid WHERE px.indrelid = '{_q(schema)}.{_q(table)}'::regclass LOOP "
        f"EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', '{schema}', r.child, "
        f"r.parent || substr(r.part, {len(table) + 1})); END LOOP; END $$")


def _rebuild(schema: str, table: str, key: str, partitioned: list[date] | None, suffix: str) -> None:
    """`table` rebuilt as a partitioned one with partitions at the `partitioned` boundaries and a
    DEFAULT one, or (None) as a plain one; every row, column, index and the id sequence carried over."""
    s, t, old = _q(schema), _q(table), _q(f"{table}_{suffix}")
    _save_and_drop_indexes(schema, table)
    op.execute(f"ALTER TABLE {s}.{t} RENAME TO {old}")
    op.execute(f"ALTER TABLE {s}.{old} RENAME CONSTRAINT {_q('pk_' + table)} TO {_q(f'pk_{table}_{suffix}')}")
    like = f"(LIKE {s}.{old} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING COMMENTS)"
    if partitioned is None:
        op.execute(f"CREATE TABLE {s}.{t} {like}")
        op.execute(f"ALTER TABLE {s}.{t} ADD CONSTRAINT {_q('pk_' + table)} PRIMARY KEY (id)")
    else:
        op.execute(f"CREATE TABLE {s}.{t} {like} PARTITION BY RANGE ({_q(key)})")
        op.execute(f"ALTER TABLE {s}.{t} ADD CONSTRAINT {_q('pk_' + table)} PRIMARY KEY (id, {_q(key)})")
        for lower, upper in pairwise(partitioned):
            op.execute(f"CREATE TABLE {s}.{_q(f'{table}_p{lower:%Y%m%d}')} PARTITION OF {s}.{t} "
                       f"FOR VALUES FROM ({_ts(lower)}) TO ({_ts(upper)})")
        op.execute(f"CREATE TABLE {s}.{_q(table + '_default')} PARTITION OF {s}.{t} DEFAULT")
    op.execute(f"INSERT INTO {s}.{t} SELECT * FROM {s}.{old}")
    _recreate_indexes(schema, table)
    if partitioned is not None:
        _name_partition_indexes(schema, table)
    op.execute(f"ALTER SEQUENCE {s}.{_q(table + '_id_seq')} OWNED BY {s}.{t}.id")
    op.execute(f"DROP TABLE {s}.{old}")
    op.execute(f"ANALYZE {s}.{t}")


def _is_postgresql() -> bool:
    return context.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    if not _is_postgresql():
        return
    schema = context.config.attributes["schema"]
    today = datetime.now(UTC).date()
    for table, key, unit_days, ahead in TABLES:
        oldest = newest = None
        if not context.is_offline_mode():
            oldest, newest = op.get_bind().execute(sa.text(
                f"SELECT min({_q(key)}), max({_q(key)}) FROM {_q(schema)}.{_q(table)}")).one()
        _rebuild(schema, table, key, _bounds(oldest, newest, unit_days, ahead, today), "unpartitioned")


def downgrade() -> None:
    """Back to 0008's plain tables, every row kept (partitions and all)."""
    if not _is_postgresql():
        return
    schema = context.config.attributes["schema"]
    for table, key, _, _ in TABLES:
        _rebuild(schema, table, key, None, "partitioned")
