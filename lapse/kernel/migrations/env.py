"""Alembic environment of Lapse's own tables, run by `lapse.kernel.database` (upgrade, offline SQL).

The effective schema comes in `config.attributes["schema"]` (None on SQLite); online runs get their
connection in `config.attributes["connection"]`, offline runs (`lapse db upgrade --sql`) render SQL
for the URL's dialect. The version table is `lapse_alembic_version` in Lapse's schema, so another
application's `alembic_version` is never touched.
"""

from alembic import context
from sqlalchemy import inspect
from sqlalchemy.schema import CreateSchema

from lapse.kernel.database import VERSION_TABLE, include_name
from lapse.kernel.models import metadata_in

config = context.config
schema = config.attributes["schema"]
connection = config.attributes.get("connection")
options = {
    "target_metadata": metadata_in(schema),
    "version_table": VERSION_TABLE,
    "version_table_schema": schema,
    "include_schemas": schema is not None,
    "include_name": include_name(schema, connection.dialect.default_schema_name if connection else None),
    "compare_type": True,
}
if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, **options)
else:
    if connection is None:
        raise RuntimeError("run migrations with `lapse db upgrade`, which supplies the connection")
    context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite", **options)
with context.begin_transaction():
    # Alembic creates its version table, which lives in the schema, before the first revision runs.
    # A schema made beforehand (by a DBA, for a role without CREATE on the database) is used as it
    # is: PostgreSQL checks that privilege even for CREATE SCHEMA IF NOT EXISTS.
    if schema is not None and (context.is_offline_mode() or not inspect(connection).has_schema(schema)):
        context.execute(CreateSchema(schema, if_not_exists=True))
    context.run_migrations()
