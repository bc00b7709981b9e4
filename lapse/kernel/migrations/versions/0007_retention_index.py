"""The one index retention needs: applied and skipped ledger rows by (state, finished_at).

`lapse prune` removes finished rows oldest first, in bounded batches (lapse.retention.queries).
Of its statements only this one had no index to walk: migration 0005 dropped the full
(finished_at) index because nothing read it then. The others reuse what exists:
dead letters ix_lapse_ledger_dead_letters, transitions ix_lapse_transitions_at (with a
primary-key probe of the ledger per candidate), sent outbox rows ix_lapse_outbox_sent.

The index is partial to applied and skipped rows, so the writes that create or move unfinished
rows (insert `pending`, claim, retry) pay nothing for it; the write that finishes a row adds one
entry (its state and a timestamp; 0004's full finished_at index took one for every write).
Measured with EXPLAIN (ANALYZE, WAL) on PostgreSQL 15, finishing 500 pending rows in one UPDATE:
2,500 WAL records with the index, 2,000 without (bytes within the noise of full-page images). The
predicate is spelled like the prune's query term on both databases: SQLite's planner uses a partial
index only when the query repeats its WHERE term. `state` leads because SQLite, without statistics,
prefers any index whose first column the query fixes by equality (ix_lapse_ledger_unfinished_due is
whole there): with (state, finished_at) both terms of the prune use this index, and it wins. The
prune takes one state at a time, so each batch is one range of the index, oldest first.

Plain CREATE INDEX in the migration's transaction: writers to the ledger wait while it is built
(it reads the table once; seconds on millions of rows).

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SETTLED = "state IN ('applied', 'skipped')"


def upgrade() -> None:
    op.create_index("ix_lapse_ledger_settled_finished", "lapse_ledger", ["state", "finished_at"],
                    schema=context.config.attributes["schema"],
                    postgresql_where=sa.text(SETTLED), sqlite_where=sa.text(SETTLED))


def downgrade() -> None:
    """Back to 0006: the prune of applied and skipped rows then scans the ledger."""
    op.drop_index("ix_lapse_ledger_settled_finished", table_name="lapse_ledger",
                  schema=context.config.attributes["schema"])
