"""The brakes: pauses, blast-radius budgets and shadow runs (docs/design/brakes.md).

- `lapse_pauses`: one row per paused kind, or tenant of a kind ('' for every tenant), paused by an
  operator or by a spent budget. A handful of rows, read whole once per batch by every processor.
- `lapse_budget_usage`: what each budgeted kind changed, one row per batch, counted over the
  budget's window along `(kind, tenant, at)`.
- `lapse_shadow_effects`: what a shadow-mode kind's effect would have done, one row per op key, by
  kind and time (a kind's results) and by time (retention prunes them with the history horizon).
- `ix_lapse_ledger_parked`: the ledger's parked rows (the new states `held` and `shadowed`) by
  kind and tenant, partial: empty while no brake is on, so it costs the hot path nothing then. The
  states are plain strings of the `state` column: no constraint changes.

New tables and an index of no rows: quick on any ledger (the CREATE INDEX reads the ledger once
while writers wait, as 0008's did).

Revision ID: 0010
Revises: 0009
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
PARKED = "state IN ('held', 'shadowed')"


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.create_table(
        "lapse_pauses",
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("cause", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("since", TS, nullable=False),
        sa.Column("details", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("kind", "tenant", name="pk_lapse_pauses"),
        schema=schema,
    )
    op.create_table(
        "lapse_budget_usage",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("effects", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_lapse_budget_usage"),
        schema=schema,
    )
    op.create_index("ix_lapse_budget_usage_kind_tenant_at", "lapse_budget_usage", ["kind", "tenant", "at"],
                    schema=schema)
    op.create_table(
        "lapse_shadow_effects",
        sa.Column("op_key", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("subject_id", sa.String(128), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("would", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("op_key", name="pk_lapse_shadow_effects"),
        schema=schema,
    )
    op.create_index("ix_lapse_shadow_effects_kind_at", "lapse_shadow_effects", ["kind", "at"], schema=schema)
    op.create_index("ix_lapse_shadow_effects_at", "lapse_shadow_effects", ["at"], schema=schema)
    op.create_index("ix_lapse_ledger_parked", "lapse_ledger", ["state", "kind", "tenant", "op_key"], schema=schema,
                    postgresql_where=sa.text(PARKED), sqlite_where=sa.text(PARKED))


def downgrade() -> None:
    """Back to 0009: parked rows go back to pending (their due time has passed, so the reconciler
    re-emits them as stuck), and the brakes' tables are dropped."""
    schema = context.config.attributes["schema"]
    ledger = sa.table("lapse_ledger", sa.column("state"), sa.column("due_at"), schema=schema)
    op.execute(ledger.update().where(ledger.c.state.in_(("held", "shadowed"))).values(state="pending"))
    op.drop_index("ix_lapse_ledger_parked", table_name="lapse_ledger", schema=schema)
    op.drop_index("ix_lapse_shadow_effects_at", table_name="lapse_shadow_effects", schema=schema)
    op.drop_index("ix_lapse_shadow_effects_kind_at", table_name="lapse_shadow_effects", schema=schema)
    op.drop_table("lapse_shadow_effects", schema=schema)
    op.drop_index("ix_lapse_budget_usage_kind_tenant_at", table_name="lapse_budget_usage", schema=schema)
    op.drop_table("lapse_budget_usage", schema=schema)
    op.drop_table("lapse_pauses", schema=schema)
