"""Initial schema: business tables, cleanup ledger, transitions, outbox.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("released_at", TS),
        sa.PrimaryKeyConstraint("id", name="pk_reservations"),
    )
    op.create_index("ix_reservations_held_due", "reservations", ["expires_at", "id"],
                    postgresql_where=sa.text("status = 'held'"), sqlite_where=sa.text("status = 'held'"))
    op.create_table(
        "artifacts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("object_key", sa.String(512), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("retain_until", TS, nullable=False),
        sa.Column("deleted_at", TS),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
    )
    op.create_index("ix_artifacts_live_due", "artifacts", ["retain_until", "id"],
                    postgresql_where=sa.text("status = 'live'"), sqlite_where=sa.text("status = 'live'"))
    op.create_table(
        "cleanup_ledger",
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
        sa.PrimaryKeyConstraint("op_key", name="pk_cleanup_ledger"),
    )
    op.create_index("ix_cleanup_ledger_kind_subject", "cleanup_ledger", ["kind", "subject_id"], unique=True)
    op.create_index("ix_cleanup_ledger_state_due", "cleanup_ledger", ["state", "due_at"])
    op.create_index("ix_cleanup_ledger_finished", "cleanup_ledger", ["finished_at"])
    op.create_table(
        "ledger_transitions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
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
        sa.PrimaryKeyConstraint("id", name="pk_ledger_transitions"),
    )
    op.create_index("ix_ledger_transitions_op_key", "ledger_transitions", ["op_key", "id"])
    op.create_index("ix_ledger_transitions_at", "ledger_transitions", ["at"])
    op.create_table(
        "outbox",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("schema", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("headers", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("sent_at", TS),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
    )
    op.create_index("ix_outbox_unsent", "outbox", ["id"],
                    postgresql_where=sa.text("sent_at IS NULL"), sqlite_where=sa.text("sent_at IS NULL"))


def downgrade() -> None:
    for table in ("outbox", "ledger_transitions", "cleanup_ledger", "artifacts", "reservations"):
        op.drop_table(table)
