"""Partition rotation through functions the tables' owner owns, so retention needs no DDL rights.

Creating and dropping a time partition of lapse_transitions or lapse_outbox (migration 0009,
`lapse.retention.partitions`) is DDL, which PostgreSQL allows only the tables' owner. A retention
role that is a member of the owner may do anything the owner may: truncate the audit trail, grant
everything to PUBLIC, drop the schema. Instead these functions run as their owner (SECURITY
DEFINER) with a fixed search_path (pg_catalog, then pg_temp last, so no object of the caller's
shadows one they use; every name in them is qualified with Lapse's schema) and check their
arguments themselves:

- `lapse_create_partition(table, lower)`: `table` is lapse_transitions or lapse_outbox; `lower`
  starts a unit of it (midnight UTC; a Monday for the weekly transitions); the partition's name
  and upper bound follow from them. The rows of its range waiting in DEFAULT move in; it is
  attached and its indexes named like the first ones (`lapse_name_partition_indexes`). Returns the
  rows moved.
- `lapse_drop_partition(table, partition)`: `partition` is a partition of `table` and not its
  DEFAULT one; it is detached and dropped, except that an outbox partition holding an unsent row
  once detached stays attached (false is returned, nothing changed).

So a caller allowed to EXECUTE them can remove rows of these two tables a partition at a time,
which its DELETE on them already allows, and create empty partitions; nothing else. EXECUTE is
revoked from PUBLIC: the owner runs them (a single-role setup), and a deployment grants them to
its retention role (compose/postgres/init-roles.sh). The caller's lock_timeout applies inside.
SQLite: nothing (no partitions).

Revision ID: 0011
Revises: 0010
"""
from __future__ import annotations

from alembic import context, op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

NAME_INDEXES = "lapse_name_partition_indexes(p_table text, p_partition text)"
CREATE = "lapse_create_partition(p_table text, p_lower timestamptz)"
DROP = "lapse_drop_partition(p_table text, p_partition text)"
# What an unsent row found in a detached outbox partition raises inside lapse_drop_partition, and
# the function catches: the subtransaction rolls the detach back.
PINNED = "LP001"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _unit_of(schema: str) -> str:
    """The lines that check `p_table` and set its partition key and unit (frozen here, like 0009's)."""
    return f"""
  s constant text := {_literal(schema)};
BEGIN
  CASE p_table
    WHEN 'lapse_transitions' THEN v_key := 'at'; v_unit := 'week';
    WHEN 'lapse_outbox' THEN v_key := 'created_at'; v_unit := 'day';
    ELSE RAISE EXCEPTION 'lapse: % is not a time-partitioned table of Lapse', p_table
      USING ERRCODE = 'invalid_parameter_value';
  END CASE;"""


def _functions(schema: str) -> list[str]:
    s = _q(schema)
    header = "LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$"
    name_indexes = f"""CREATE FUNCTION {s}.{NAME_INDEXES} RETURNS void {header}
DECLARE
  s constant text := {_literal(schema)};
  suffix text := substr(p_partition, length(p_table) + 1);
  r record;
BEGIN
  FOR r IN SELECT ci.relname AS child, pi.relname AS parent FROM pg_index x
      JOIN pg_class ci ON ci.oid = x.indexrelid JOIN pg_inherits i ON i.inhrelid = ci.oid
      JOIN pg_class pi ON pi.oid = i.inhparent
      WHERE x.indrelid = format('%I.%I', s, p_partition)::regclass LOOP
    IF r.child <> r.parent || suffix THEN
      EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', s, r.child, r.parent || suffix);
    END IF;
  END LOOP;
END $fn$"""
    create = f"""CREATE FUNCTION {s}.{CREATE} RETURNS bigint SECURITY DEFINER {header}
DECLARE
  v_key text; v_unit text; v_lower timestamptz; v_upper timestamptz; v_name text; v_moved bigint;
{_unit_of(schema)}
  v_lower := date_trunc(v_unit, p_lower AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
  IF p_lower IS NULL OR v_lower <> p_lower THEN
    RAISE EXCEPTION 'lapse: a partition of % starts at the start of a % (UTC), not at %', p_table, v_unit, p_lower
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_upper := v_lower + ('1 ' || v_unit)::interval;
  v_name := p_table || '_p' || to_char(v_lower AT TIME ZONE 'UTC', 'YYYYMMDD');
  -- ATTACH takes this lock anyway; taken first, no row of the range reaches DEFAULT between the
  -- move and the attach (which would fail it). Inserts routed elsewhere never wait for it.
  EXECUTE format('LOCK TABLE %I.%I IN ACCESS EXCLUSIVE MODE', s, p_table || '_default');
  EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING CONSTRAINTS INCLUDING GENERATED)',
                 s, v_name, s, p_table);
  EXECUTE format('WITH moved AS (DELETE FROM %I.%I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                 'INSERT INTO %I.%I SELECT * FROM moved', s, p_table || '_default', v_key, v_key, s, v_name)
    USING v_lower, v_upper;
  GET DIAGNOSTICS v_moved = ROW_COUNT;
  EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                 s, p_table, s, v_name, v_lower, v_upper);
  PERFORM {s}.lapse_name_partition_indexes(p_table, v_name);
  RETURN v_moved;
END $fn$"""
    drop = f"""CREATE FUNCTION {s}.{DROP} RETURNS boolean SECURITY DEFINER {header}
DECLARE
  v_key text; v_unit text; v_bound text; v_unsent boolean;
{_unit_of(schema)}
  SELECT pg_get_expr(c.relpartbound, c.oid) INTO v_bound FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
    JOIN pg_namespace n ON n.oid = p.relnamespace
    WHERE n.nspname = s AND p.relname = p_table AND c.relname = p_partition;
  IF v_bound IS NULL THEN
    RAISE EXCEPTION 'lapse: % is not a partition of %', p_partition, p_table
      USING ERRCODE = 'invalid_parameter_value';
  ELSIF v_bound = 'DEFAULT' THEN
    RAISE EXCEPTION 'lapse: the DEFAULT partition of % is never dropped', p_table
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  BEGIN
    EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I', s, p_table, s, p_partition);
    IF p_table = 'lapse_outbox' THEN  -- detached, nothing can write to it: probe again
      EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE sent_at IS NULL)', s, p_partition) INTO v_unsent;
      IF v_unsent THEN
        RAISE EXCEPTION USING ERRCODE = '{PINNED}';
      END IF;
    END IF;
    EXECUTE format('DROP TABLE %I.%I', s, p_partition);
    RETURN true;
  EXCEPTION WHEN SQLSTATE '{PINNED}' THEN
    RETURN false;  -- the detach is rolled back with this block
  END;
END $fn$"""
    return [name_indexes, create, drop,
            *(f"REVOKE ALL ON FUNCTION {s}.{signature} FROM PUBLIC" for signature in (NAME_INDEXES, CREATE, DROP))]


def _is_postgresql() -> bool:
    return context.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    if not _is_postgresql():
        return
    for statement in _functions(context.config.attributes["schema"]):
        op.execute(statement)


def downgrade() -> None:
    """Back to 0009: the functions go (the partitions they made stay, owned by the tables' owner)."""
    if not _is_postgresql():
        return
    s = _q(context.config.attributes["schema"])
    for signature in (DROP, CREATE, NAME_INDEXES):
        op.execute(f"DROP FUNCTION {s}.{signature}")  # the argument names are ignored there
