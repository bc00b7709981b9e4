"""The brakes: pauses, budget grants, shadow effects, and an index on parked ledger rows.

- `lapse_pauses`: the pauses in force, a handful of rows read whole on every batch.
- `lapse_budget_grants`: the effects granted to budgeted kinds; the count in a window is a sum over
  (kind, tenant, at) along its index; grants older than the longest window are pruned.
- `lapse_shadow_effects`: what a shadow kind's effect would have changed, one row per operation.
- `ix_lapse_ledger_parked`: held and shadowed rows by kind and tenant (how much waits, the release),
  partial so that the ledger's other rows take no entry.

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
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("since", TS, nullable=False),
        sa.PrimaryKeyConstraint("kind", "tenant", name="pk_lapse_pauses"),
        schema=schema,
    )
    op.create_table(
        "lapse_budget_grants",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("effects", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_lapse_budget_grants"),
        schema=schema,
    )
    op.create_index("ix_lapse_budget_grants_kind_at", "lapse_budget_grants", ["kind", "tenant", "at"],
                    schema=schema)
    op.create_table(
        "lapse_shadow_effects",
        sa.Column("op_key", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("subject_id", sa.String(128), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("would", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("op_key", name="pk_lapse_shadow_effects"),
        schema=schema,
    )
    op.create_index("ix_lapse_shadow_effects_kind_at", "lapse_shadow_effects", ["kind", "at"], schema=schema)
    op.create_index("ix_lapse_ledger_parked", "lapse_ledger", ["kind", "tenant", "state", "due_at", "op_key"],
                    schema=schema, postgresql_where=sa.text(PARKED), sqlite_where=sa.text(PARKED))


def downgrade() -> None:
    """Back to 0009: the brakes' tables go (held and shadowed rows must have been released first)."""
    schema = context.config.attributes["schema"]
    op.drop_index("ix_lapse_ledger_parked", table_name="lapse_ledger", schema=schema)
    op.drop_table("lapse_shadow_effects", schema=schema)
    op.drop_table("lapse_budget_grants", schema=schema)
    op.drop_table("lapse_pauses", schema=schema)
