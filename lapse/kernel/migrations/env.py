"""Alembic environment: runs on the connection `lapse.kernel.database.upgrade_url` hands over."""

from alembic import context

from lapse.kernel.models import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with `lapse db upgrade`, which supplies the connection")
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
