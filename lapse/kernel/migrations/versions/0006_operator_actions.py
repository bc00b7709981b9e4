"""The operator actions table: one row per action an operator took that changed something (a
dead-letter replay, an offsets reset, a destructive topics apply), with the actor they gave, the
database session user, the reason, the target and the details.

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import context, op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    op.create_table(
        "lapse_operator_actions",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("db_user", sa.String(128), nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("details", sa.JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_lapse_operator_actions"),
        schema=schema,
    )


def downgrade() -> None:
    """Removes the operator actions table and every row in it."""
    op.drop_table("lapse_operator_actions", schema=context.config.attributes["schema"])
