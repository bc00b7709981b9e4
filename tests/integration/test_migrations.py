"""The migrated schema is exactly the models, on PostgreSQL and on SQLite."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from lapse.kernel.database import make_engine
from lapse.kernel.models import metadata


def test_migrated_schema_equals_models(db_url):
    engine = make_engine(db_url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, metadata)
    engine.dispose()
    assert diff == []
