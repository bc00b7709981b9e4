"""Call limits shared by every worker (docs/design/limits.md).

- `lapse_limit_routes`: one row per route of an external effect's calls (a kind, or one endpoint or
  tenant of it): its adaptive rate, the next free call slot, the end of a Retry-After.
- `lapse_limit_slots`: a route's concurrency slots, each leased to a worker until a time.
- `lapse_limit_stats`: what each worker saw of the calls to each endpoint over its last minute, for
  status.

New, small tables (a row per route, per slot, per worker and route): quick on any database.

Revision ID: 0017
Revises: 0014
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0017"
down_revision = "0014"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.create_table(
        "lapse_limit_routes",
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("route", sa.String(300), nullable=False),
        sa.Column("ceiling_per_s", sa.Float, nullable=False),
        sa.Column("rate_per_s", sa.Float, nullable=False),
        sa.Column("rate_at", TS, nullable=False),
        sa.Column("next_at", TS, nullable=False),
        sa.Column("lowered_at", TS),
        sa.Column("blocked_until", TS),
        sa.Column("concurrency", sa.Integer),
        sa.PrimaryKeyConstraint("kind", "route", name="pk_lapse_limit_routes"),
        schema=schema,
    )
    op.create_table(
        "lapse_limit_slots",
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("route", sa.String(300), nullable=False),
        sa.Column("slot", sa.Integer, nullable=False),
        sa.Column("holder", sa.String(128)),
        sa.Column("until", TS),
        sa.PrimaryKeyConstraint("kind", "route", "slot", name="pk_lapse_limit_slots"),
        schema=schema,
    )
    op.create_table(
        "lapse_limit_stats",
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("endpoint", sa.String(300), nullable=False),
        sa.Column("worker", sa.String(128), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("in_flight", sa.Integer, nullable=False),
        sa.Column("calls", sa.Integer, nullable=False),
        sa.Column("throttled", sa.Integer, nullable=False),
        sa.Column("waited_s", sa.Float, nullable=False),
        sa.Column("called_s", sa.Float, nullable=False),
        sa.Column("window_s", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("kind", "endpoint", "worker", name="pk_lapse_limit_stats"),
        schema=schema,
    )


def downgrade() -> None:
    schema = context.config.attributes["schema"]
    op.drop_table("lapse_limit_stats", schema=schema)
    op.drop_table("lapse_limit_slots", schema=schema)
    op.drop_table("lapse_limit_routes", schema=schema)
