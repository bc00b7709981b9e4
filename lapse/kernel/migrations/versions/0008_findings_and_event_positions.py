"""What the console's overview and an operation's history needed that nothing kept.

- `lapse_findings`: the latest finding of each role on each subject, overwritten in place — the
  reconciler's last pass, the audit's last verdict, every dead-letter circuit a worker opened.
  A handful of rows, read by primary key; status and the console show them.
- `lapse_transitions.event_topic/event_partition/event_offset`: where the consumed event that made
  a transition was read, so one operation's history names the record behind each step. Nullable:
  transitions not made by a consumed event (sweep, reconciler, replay) and every older row have none.
- `ix_lapse_ledger_correlation`: operations by the correlation id they were created with. The
  search by correlation id walked every transition of a day (350-650 ms on a 2,000,000-row
  ledger). One more entry per ledger insert; the ledger takes one row per operation, against two
  or more transitions, so the index sits on the ledger. Measured with EXPLAIN (ANALYZE, WAL) on
  PostgreSQL 15, inserting 500 ledger rows: 0.4-0.6 ms more per 500 rows (about 3% of the insert).

Plain ALTER TABLE ... ADD COLUMN of nullable columns without defaults is a catalog change only;
the CREATE INDEX reads the ledger once (seconds on millions of rows) while writers wait.

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.create_table(
        "lapse_findings",
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(300), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("until", TS),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("details", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("role", "subject", name="pk_lapse_findings"),
        schema=schema,
    )
    with op.batch_alter_table("lapse_transitions", schema=schema) as batch:
        batch.add_column(sa.Column("event_topic", sa.String(249)))
        batch.add_column(sa.Column("event_partition", sa.Integer))
        batch.add_column(sa.Column("event_offset", sa.BigInteger))
    op.create_index("ix_lapse_ledger_correlation", "lapse_ledger", ["correlation_id"], schema=schema)


def downgrade() -> None:
    """Back to 0007: the findings and the events' positions are dropped."""
    schema = context.config.attributes["schema"]
    op.drop_index("ix_lapse_ledger_correlation", table_name="lapse_ledger", schema=schema)
    with op.batch_alter_table("lapse_transitions", schema=schema) as batch:
        batch.drop_column("event_offset")
        batch.drop_column("event_partition")
        batch.drop_column("event_topic")
    op.drop_table("lapse_findings", schema=schema)
