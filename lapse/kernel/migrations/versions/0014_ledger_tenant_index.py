"""A tenant's operations: `ix_lapse_ledger_tenant` (tenant, kind, op_key).

`lapse show --tenant T [--kind K]` lists a tenant's operations a page at a time in (kind, op key)
order, and every command given a tenant refuses one no operation has (`dlq --tenant`, `show
--tenant`): without an index both read the whole ledger. With it, a page is one range walk and
the probe one lookup. One more entry per ledger insert (and per non-HOT update, as every index);
measured with EXPLAIN (ANALYZE, WAL) on PostgreSQL 15, inserting 500 ledger rows: 3,020 WAL
records against 2,525, about 12% more WAL bytes, the time within the noise (docs/performance.md).

Plain CREATE INDEX in the migration's transaction, as the earlier ones: writers to the ledger wait
while it is built (it reads the table once; seconds on millions of rows).

Revision ID: 0014
Revises: 0011
"""
from alembic import context, op

revision = "0014"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_lapse_ledger_tenant", "lapse_ledger", ["tenant", "kind", "op_key"],
                    schema=context.config.attributes["schema"])


def downgrade() -> None:
    """Back to 0009: the tenant index is dropped."""
    op.drop_index("ix_lapse_ledger_tenant", table_name="lapse_ledger", schema=context.config.attributes["schema"])
