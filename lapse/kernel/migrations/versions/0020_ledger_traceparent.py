"""Traces: a dead-lettered operation keeps its W3C traceparent, which its replay carries on
(docs/design/traces.md).

One nullable column, no default: PostgreSQL adds it to the catalogue only (no table rewrite, no
index), and only dead letters ever fill it. The downgrade drops it; replays then start without
their operation's trace context.

Revision ID: 0020
Revises: 0018
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0020"
down_revision = "0018"
branch_labels = None
depends_on = None

TABLE, COLUMN = "lapse_ledger", "traceparent"


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.add_column(TABLE, sa.Column(COLUMN, sa.String(55), nullable=True), schema=schema)


def downgrade() -> None:
    """Back to 0018: the column dropped."""
    schema = context.config.attributes["schema"]
    op.drop_column(TABLE, COLUMN, schema=schema)
