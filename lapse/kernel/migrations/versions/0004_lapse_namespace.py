"""Lapse's tables in their own namespace: lapse_-prefixed, in their own schema on PostgreSQL.

On a fresh database it creates the four tables and their indexes (env.py has created the schema,
which Alembic's version table needs first). On a database in the previous layout (revisions
0001-0003: unprefixed tables and Alembic's default alembic_version in the default schema, at 0003)
it moves the four tables in place, keeping every row: SET SCHEMA and RENAME on PostgreSQL, with
their indexes, sequences and primary keys renamed to match a fresh install; RENAME on SQLite, with
the indexes re-created under their new names. Lapse's row leaves the old version table (dropped
when empty). reservations and artifacts are left alone: they are business data now.

Revision ID: 0004
Revises:
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0004"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)

# The previous layout, frozen: old table → new table, old index → new index, old sequence → new.
TABLES = {"cleanup_ledger": "lapse_ledger", "ledger_transitions": "lapse_transitions",
          "outbox": "lapse_outbox", "daily_reports": "lapse_daily_reports"}
INDEXES = {
    "ix_cleanup_ledger_kind_subject": "ix_lapse_ledger_kind_subject",
    "ix_cleanup_ledger_state_due": "ix_lapse_ledger_state_due",
    "ix_cleanup_ledger_finished": "ix_lapse_ledger_finished",
    "ix_cleanup_ledger_state_due_key": "ix_lapse_ledger_state_due_key",
    "ix_cleanup_ledger_claimed_until": "ix_lapse_ledger_claimed_until",
    "ix_ledger_transitions_op_key": "ix_lapse_transitions_op_key",
    "ix_ledger_transitions_at": "ix_lapse_transitions_at",
    "ix_outbox_unsent": "ix_lapse_outbox_unsent",
    "ix_daily_reports_undelivered": "ix_lapse_daily_reports_undelivered",
}
SEQUENCES = {"ledger_transitions_id_seq": "lapse_transitions_id_seq", "outbox_id_seq": "lapse_outbox_id_seq"}
LEGACY_VERSION_TABLE = "alembic_version"
LEGACY_HEAD = "0003"


def _partial(condition: str) -> dict[str, sa.TextClause]:
    return {"postgresql_where": sa.text(condition), "sqlite_where": sa.text(condition)}


def create_indexes(schema: str | None) -> None:
    """Every index of Lapse's four tables, under its new name."""
    ix = op.create_index
    ix("ix_lapse_ledger_kind_subject", "lapse_ledger", ["kind", "subject_id"], unique=True, schema=schema)
    ix("ix_lapse_ledger_state_due", "lapse_ledger", ["state", "due_at"], schema=schema)
    ix("ix_lapse_ledger_finished", "lapse_ledger", ["finished_at"], schema=schema)
    ix("ix_lapse_ledger_state_due_key", "lapse_ledger", ["state", "due_at", "op_key"], schema=schema)
    ix("ix_lapse_ledger_claimed_until", "lapse_ledger", ["claim_until", "op_key"], schema=schema,
       **_partial("state = 'claimed'"))
    ix("ix_lapse_transitions_op_key", "lapse_transitions", ["op_key", "id"], schema=schema)
    ix("ix_lapse_transitions_at", "lapse_transitions", ["at"], schema=schema)
    ix("ix_lapse_outbox_unsent", "lapse_outbox", ["id"], schema=schema, **_partial("sent_at IS NULL"))
    ix("ix_lapse_daily_reports_undelivered", "lapse_daily_reports", ["report_key"], schema=schema,
       **_partial("delivered_at IS NULL"))


def create_tables(schema: str | None) -> None:
    """A fresh install: the four tables and their indexes in `schema`."""
    op.create_table(
        "lapse_ledger",
        sa.Column("op_key", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("subject_id", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("due_at", TS, nullable=False),
        sa.Column("claim_owner", sa.String(128)),
        sa.Column("claim_until", TS),
        sa.Column("last_failure_class", sa.String(32)),
        sa.Column("last_failure", sa.Text),
        sa.Column("replay_id", sa.String(64)),
        sa.Column("correlation_id", sa.String(64), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("duplicates", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("finished_at", TS),
        sa.PrimaryKeyConstraint("op_key", name="pk_lapse_ledger"),
        schema=schema,
    )
    op.create_table(
        "lapse_transitions",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("op_key", sa.String(200), nullable=False),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("failure_class", sa.String(32)),
        sa.Column("reason", sa.Text),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("replay_id", sa.String(64)),
        sa.Column("correlation_id", sa.String(64)),
        sa.Column("at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_lapse_transitions"),
        schema=schema,
    )
    op.create_table(
        "lapse_outbox",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("schema", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("headers", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("sent_at", TS),
        sa.PrimaryKeyConstraint("id", name="pk_lapse_outbox"),
        schema=schema,
    )
    op.create_table(
        "lapse_daily_reports",
        sa.Column("report_key", sa.String(64), nullable=False),
        sa.Column("report_date", sa.Date, nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("delivered_at", TS),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text),
        sa.PrimaryKeyConstraint("report_key", name="pk_lapse_daily_reports"),
        schema=schema,
    )
    create_indexes(schema)


def legacy_revision(bind: sa.Connection) -> str | None:
    """Lapse's revision in the previous layout, or None when the database has none of it."""
    insp = sa.inspect(bind)
    if not (insp.has_table(LEGACY_VERSION_TABLE) and insp.has_table("cleanup_ledger")):
        return None
    found = bind.execute(sa.text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}")).scalars().all()
    return next((rev for rev in ("0001", "0002", "0003") if rev in found), None)


def move_postgresql(bind: sa.Connection, schema: str) -> None:
    """Move the four tables into `schema` under their new names; their indexes, primary keys and
    sequences follow SET SCHEMA and are renamed to match a fresh install."""
    q = bind.dialect.identifier_preparer.quote
    for old, new in TABLES.items():
        # Unqualified, as the previous layout named them: found through the search path.
        op.execute(f"ALTER TABLE {q(old)} SET SCHEMA {q(schema)}")
        op.rename_table(old, new, schema=schema)
        op.execute(f"ALTER TABLE {q(schema)}.{q(new)} RENAME CONSTRAINT {q('pk_' + old)} TO {q('pk_' + new)}")
    for old, new in INDEXES.items():
        op.execute(f"ALTER INDEX {q(schema)}.{q(old)} RENAME TO {q(new)}")
    for old, new in SEQUENCES.items():
        op.execute(f"ALTER SEQUENCE {q(schema)}.{q(old)} RENAME TO {q(new)}")


def move_sqlite() -> None:
    """Rename the four tables; SQLite cannot rename an index, so each is dropped and re-created
    under its new name. (A primary key's constraint name stays in the table's stored DDL.)"""
    for old in INDEXES:
        op.drop_index(old)
    for old, new in TABLES.items():
        op.rename_table(old, new)
    create_indexes(None)


def forget_legacy_version(bind: sa.Connection) -> None:
    """Take Lapse's row out of the old version table; drop the table when nothing else is in it."""
    op.execute(sa.text(f"DELETE FROM {LEGACY_VERSION_TABLE} WHERE version_num = :v").bindparams(v=LEGACY_HEAD))
    if bind.execute(sa.text(f"SELECT count(*) FROM {LEGACY_VERSION_TABLE}")).scalar() == 0:
        op.drop_table(LEGACY_VERSION_TABLE)


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    if context.is_offline_mode():  # offline SQL is for a fresh install
        create_tables(schema)
        return
    bind = op.get_bind()
    legacy = legacy_revision(bind)
    if legacy is None:
        create_tables(schema)
        return
    if legacy != LEGACY_HEAD:
        raise RuntimeError(f"Lapse's tables are at the old revision {legacy}; upgrade them to {LEGACY_HEAD} first")
    if bind.dialect.name == "postgresql":
        move_postgresql(bind, schema)
    else:
        move_sqlite()
    forget_legacy_version(bind)


def downgrade() -> None:
    """Removes Lapse's tables and every row in them (the schema stays: the version table is in it)."""
    schema = context.config.attributes["schema"]
    for table in ("lapse_daily_reports", "lapse_outbox", "lapse_transitions", "lapse_ledger"):
        op.drop_table(table, schema=schema)
