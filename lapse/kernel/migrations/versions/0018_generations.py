"""Recurring operations: a subject's ledger rows, one per lapse (docs/design/generations.md).

A kind that declares a generation column names each lapse of a business row apart
(`release-reservation:42@<generation>`), so one (kind, subject id) may now have several ledger
rows: `ix_lapse_ledger_kind_subject` stays, no longer unique. Nothing else changes: every op key
already written stays valid (a key without a generation is what a kind without one still writes),
and no column changes.

Plain DROP INDEX and CREATE INDEX in the migration's transaction, as 0007's: writers to the ledger
wait while the index is built again (it reads the table once; seconds on millions of rows).
The downgrade makes it unique again, which fails while any subject has two operations: prune them
or keep this revision.

Revision ID: 0018
Revises: 0017
"""
from alembic import context, op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

INDEX, TABLE, COLUMNS = "ix_lapse_ledger_kind_subject", "lapse_ledger", ["kind", "subject_id"]


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.drop_index(INDEX, table_name=TABLE, schema=schema)
    op.create_index(INDEX, TABLE, COLUMNS, schema=schema)


def downgrade() -> None:
    """Back to 0010: the index unique again (refused while a subject has several operations)."""
    schema = context.config.attributes["schema"]
    op.drop_index(INDEX, table_name=TABLE, schema=schema)
    op.create_index(INDEX, TABLE, COLUMNS, unique=True, schema=schema)
