"""Reconciler keyset index on the ledger; daily_reports (unique report key, undelivered = outbox).

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_index("ix_cleanup_ledger_state_due_key", "cleanup_ledger", ["state", "due_at", "op_key"])
    op.create_table(
        "daily_reports",
        sa.Column("report_key", sa.String(64), nullable=False),
        sa.Column("report_date", sa.Date, nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("delivered_at", TS),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text),
        sa.PrimaryKeyConstraint("report_key", name="pk_daily_reports"),
    )
    op.create_index("ix_daily_reports_undelivered", "daily_reports", ["report_key"],
                    postgresql_where=sa.text("delivered_at IS NULL"),
                    sqlite_where=sa.text("delivered_at IS NULL"))


def downgrade() -> None:
    op.drop_table("daily_reports")
    op.drop_index("ix_cleanup_ledger_state_due_key", table_name="cleanup_ledger")
