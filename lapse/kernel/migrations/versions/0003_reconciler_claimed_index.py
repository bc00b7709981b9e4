"""Reconciler: index claimed ledger rows by lease end, to find leases that expired long ago.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_cleanup_ledger_claimed_until", "cleanup_ledger", ["claim_until", "op_key"],
                    postgresql_where=sa.text("state = 'claimed'"),
                    sqlite_where=sa.text("state = 'claimed'"))


def downgrade() -> None:
    op.drop_index("ix_cleanup_ledger_claimed_until", table_name="cleanup_ledger")
