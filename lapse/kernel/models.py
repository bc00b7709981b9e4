"""Table definitions (SQLAlchemy Core) of Lapse's own tables: the cleanup ledger, its
transitions, the outbox, the daily reports, the operator actions, the findings, the brakes
(pauses, budget usage, shadow effects) and the call limits (routes, slots, stats). Alembic migrations create
exactly these; a test compares them.

Lapse's tables live in their own namespace so they never collide with a user's tables: every name
has the `lapse_` prefix, and on PostgreSQL they sit in a schema of their own. Here that schema is
the placeholder `SCHEMA`; an engine maps it to the configured schema (or to none on SQLite) with
SQLAlchemy's `schema_translate_map` (`lapse.kernel.database.make_engine`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Date,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from lapse.kernel.schema_names import DATABASE_SCHEMA

# The placeholder schema of Lapse's tables, translated per engine to the effective one.
SCHEMA = DATABASE_SCHEMA

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# BIGINT on PostgreSQL, INTEGER (the rowid alias, so it autoincrements) on SQLite.
Id = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps stored in UTC and always returned timezone-aware, on PostgreSQL and SQLite."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# One row per business operation; the op key is the idempotency key.
cleanup_ledger = Table(
    "lapse_ledger",
    metadata,
    Column("op_key", String(200), primary_key=True),
    Column("kind", String(64), nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("subject_id", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("due_at", UTCDateTime(), nullable=False),
    Column("claim_owner", String(128)),
    Column("claim_until", UTCDateTime()),
    Column("last_failure_class", String(32)),
    Column("last_failure", Text),
    Column("replay_id", String(64)),
    Column("correlation_id", String(64), nullable=False),
    Column("source", String(16), nullable=False),
    Column("duplicates", Integer, nullable=False, server_default="0"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime()),
    # Only the indexes a query needs (migration 0005 has the measurements). A partial index takes
    # an entry only for the rows its predicate keeps, and every ledger write is a non-HOT update.
    # Probes of a business row's ledger row (sweep, reconciler, status), and a subject's operations:
    # one per lapse for a kind with a generation (`<kind>:<id>@<generation>`), so not unique (0018).
    Index("ix_lapse_ledger_kind_subject", "kind", "subject_id"),
    # The unfinished rows by state and due time: the reconciler's stuck keyset, the oldest
    # unfinished due time, bring-forward. Partial on PostgreSQL only: SQLite's planner uses a
    # partial index only when the query repeats its WHERE term.
    Index("ix_lapse_ledger_unfinished_due", "state", "due_at", "op_key",
          postgresql_where=text("state IN ('pending', 'claimed', 'retry_scheduled')")),
    # Claims by lease end: the reconciler's stuck claims, expired claims in status.
    Index("ix_lapse_ledger_claimed_until", "claim_until", "op_key",
          postgresql_where=text("state = 'claimed'"), sqlite_where=text("state = 'claimed'")),
    # Dead letters oldest first: `lapse dlq` list and replay.
    Index("ix_lapse_ledger_dead_letters", "finished_at", "op_key",
          postgresql_where=text("state = 'dead_letter'"), sqlite_where=text("state = 'dead_letter'")),
    # Applied and skipped rows by finish time: retention's prune (migration 0007 says why and what it costs).
    Index("ix_lapse_ledger_settled_finished", "state", "finished_at",
          postgresql_where=text("state IN ('applied', 'skipped')"),
          sqlite_where=text("state IN ('applied', 'skipped')")),
    # Operations by the correlation id they were created with: search by correlation id (0008).
    Index("ix_lapse_ledger_correlation", "correlation_id"),
    # Parked rows (held by a brake, or shadowed) by kind and tenant: their release and the counts of
    # work waiting under a brake (0010). Empty while no brake is on.
    Index("ix_lapse_ledger_parked", "state", "kind", "tenant", "op_key",
          postgresql_where=text("state IN ('held', 'shadowed')"),
          sqlite_where=text("state IN ('held', 'shadowed')")),
    # A tenant's operations by kind: `lapse show --tenant`, and whether a tenant is known (0014).
    Index("ix_lapse_ledger_tenant", "tenant", "kind", "op_key"),
    schema=SCHEMA,
)

# Append-only history of every ledger transition, for operators and audits.
ledger_transitions = Table(
    "lapse_transitions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("op_key", String(200), nullable=False),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("failure_class", String(32)),
    Column("reason", Text),
    Column("actor", String(128), nullable=False),
    Column("replay_id", String(64)),
    Column("correlation_id", String(64)),
    # In the primary key because it is the partition key on PostgreSQL (weekly range partitions,
    # migration 0009); SQLite's table keeps `id` alone as its key (the rowid alias).
    Column("at", UTCDateTime(), primary_key=True, nullable=False),
    # Where the event that made this transition was read (None: not made by a consumed event).
    Column("event_topic", String(249)),
    Column("event_partition", Integer),
    Column("event_offset", BigInteger),
    # A dead letter's failure history: the failed attempts of an op key, the only transitions read by key.
    Index("ix_lapse_transitions_failures", "op_key", "id",
          postgresql_where=text("failure_class IS NOT NULL"), sqlite_where=text("failure_class IS NOT NULL")),
    Index("ix_lapse_transitions_at", "at"),  # the daily report's day
    schema=SCHEMA,
    postgresql_partition_by="RANGE (at)",
)

# Records to publish, written in the same transaction as the change they describe.
outbox = Table(
    "lapse_outbox",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("topic", String(249), nullable=False),
    Column("key", String(200), nullable=False),
    Column("schema", String(64), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("headers", JSON, nullable=False),
    # In the primary key because it is the partition key on PostgreSQL (daily range partitions,
    # migration 0009); SQLite's table keeps `id` alone as its key (the rowid alias).
    Column("created_at", UTCDateTime(), primary_key=True, nullable=False),
    Column("sent_at", UTCDateTime()),
    Index("ix_lapse_outbox_unsent", "id", postgresql_where=text("sent_at IS NULL"),  # the relay's next rows
          sqlite_where=text("sent_at IS NULL")),
    Index("ix_lapse_outbox_sent", "sent_at", postgresql_where=text("sent_at IS NOT NULL"),  # the relay's purge
          sqlite_where=text("sent_at IS NOT NULL")),
    schema=SCHEMA,
    postgresql_partition_by="RANGE (created_at)",
)

# One row per daily report, keyed `daily-report:YYYY-MM-DD`; undelivered rows are its outbox.
daily_reports = Table(
    "lapse_daily_reports",
    metadata,
    Column("report_key", String(64), primary_key=True),
    Column("report_date", Date, nullable=False),
    Column("payload", JSON, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("delivered_at", UTCDateTime()),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    Index("ix_lapse_daily_reports_undelivered", "report_key", postgresql_where=text("delivered_at IS NULL"),
          sqlite_where=text("delivered_at IS NULL")),
    schema=SCHEMA,
)

# One row per operator action that changed something (a dead-letter replay, an offsets reset, a
# destructive topics apply): who asked (actor), who the database knew (db_user), why, on what.
operator_actions = Table(
    "lapse_operator_actions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("action", String(32), nullable=False),
    Column("actor", String(128), nullable=False),
    Column("reason", Text, nullable=False),
    Column("db_user", String(128), nullable=False),
    Column("target", Text, nullable=False),
    Column("details", JSON, nullable=False),
    schema=SCHEMA,
)


# The latest finding of each role on each subject, overwritten in place: the reconciler's last pass,
# the audit's last verdict, each dead-letter circuit a worker opened (subject: topic[partition]).
findings = Table(
    "lapse_findings",
    metadata,
    Column("role", String(32), primary_key=True),
    Column("subject", String(300), primary_key=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("until", UTCDateTime()),
    Column("summary", Text, nullable=False),
    Column("details", JSON, nullable=False),
    schema=SCHEMA,
)


# The brakes on (docs/design/brakes.md): one row per paused kind, or tenant of a kind ('' stands for
# every tenant), paused by an operator or by a spent budget (`cause`); a resume deletes the row.
pauses = Table(
    "lapse_pauses",
    metadata,
    Column("kind", String(64), primary_key=True),
    Column("tenant", String(64), primary_key=True),
    Column("cause", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("since", UTCDateTime(), nullable=False),
    Column("details", JSON, nullable=False),
    schema=SCHEMA,
)

# What each budgeted kind (or tenant of one: `tenant`, else '') changed, one row per batch, at the
# latest time its effects could happen: the window a budget counts is a range of `at`.
budget_usage = Table(
    "lapse_budget_usage",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("kind", String(64), nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("at", UTCDateTime(), nullable=False),
    Column("effects", Integer, nullable=False),
    Index("ix_lapse_budget_usage_kind_tenant_at", "kind", "tenant", "at"),
    schema=SCHEMA,
)

# What a shadow-mode kind's effect would have done to each operation, instead of doing it: the
# latest word per op key (a redelivery overwrites it).
shadow_effects = Table(
    "lapse_shadow_effects",
    metadata,
    Column("op_key", String(200), primary_key=True),
    Column("kind", String(64), nullable=False),
    Column("tenant", String(64), nullable=False),
    Column("subject_id", String(128), nullable=False),
    Column("at", UTCDateTime(), nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("would", JSON, nullable=False),
    Index("ix_lapse_shadow_effects_kind_at", "kind", "at"),  # a kind's results, newest first
    Index("ix_lapse_shadow_effects_at", "at"),  # retention's prune, by age
    schema=SCHEMA,
)


# The call limits (docs/design/limits.md): one row per route — a kind's calls, or those to one
# endpoint or of one tenant of it (`route`: '', 'endpoint:HOST', 'tenant:NAME') — with its adaptive
# rate, the start of its next free call slot and the end of a Retry-After; all times the database's.
limit_routes = Table(
    "lapse_limit_routes",
    metadata,
    Column("kind", String(64), primary_key=True),
    Column("route", String(300), primary_key=True),
    Column("ceiling_per_s", Float, nullable=False),  # the declared rate
    Column("rate_per_s", Float, nullable=False),  # the rate now: halved by a 429, climbing back
    Column("rate_at", UTCDateTime(), nullable=False),  # when rate_per_s was set
    Column("next_at", UTCDateTime(), nullable=False),  # no call slot is handed out before it
    Column("lowered_at", UTCDateTime()),  # the last halving
    Column("blocked_until", UTCDateTime()),  # a Retry-After: no call starts before it
    Column("concurrency", Integer),  # the declared calls in flight (null: none)
    schema=SCHEMA,
)

# A route's concurrency slots, leased: a worker holds a slot until `until` (the database's time,
# renewed while its calls run); a worker that dies leaves it to expire.
limit_slots = Table(
    "lapse_limit_slots",
    metadata,
    Column("kind", String(64), primary_key=True),
    Column("route", String(300), primary_key=True),
    Column("slot", Integer, primary_key=True),
    Column("holder", String(128)),
    Column("until", UTCDateTime()),
    schema=SCHEMA,
)

# What each worker saw of the calls to each endpoint of a kind (an HTTP host, a bucket, a topic) over
# its last minute, written every few seconds while it calls: status sums the fresh rows.
limit_stats = Table(
    "lapse_limit_stats",
    metadata,
    Column("kind", String(64), primary_key=True),
    Column("endpoint", String(300), primary_key=True),
    Column("worker", String(128), primary_key=True),
    Column("at", UTCDateTime(), nullable=False),
    Column("in_flight", Integer, nullable=False),
    Column("calls", Integer, nullable=False),
    Column("throttled", Integer, nullable=False),  # answered 429 (or a store's SlowDown)
    Column("waited_s", Float, nullable=False),  # waiting for a slot, summed over the calls
    Column("called_s", Float, nullable=False),  # in the downstream call, summed over the calls
    Column("window_s", Float, nullable=False),  # how long the counts above cover
    schema=SCHEMA,
)


def metadata_in(schema: str | None) -> MetaData:
    """A copy of Lapse's tables in the effective `schema` (None: the default one, as on SQLite),
    for what cannot go through an engine's translate map: Alembic's comparison of models and
    database."""
    copy = MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.tables.values():
        # None puts the copy in `copy`'s own schema, the default one; the stubs spell out only str.
        table.to_metadata(copy, schema=schema)  # type: ignore[arg-type]
    return copy
