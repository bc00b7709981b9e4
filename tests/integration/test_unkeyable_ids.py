"""A team's table whose text ids cannot all form an op key (a space, a colon, an accent, a line
break, more than 128 characters), on PostgreSQL and Apache Kafka: the sweep and the reconciler set
those rows aside, counted and logged, and go on with the rest, even when a whole page of the
earliest due rows is made of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, text

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.models import cleanup_ledger
from lapse.producers import sweep_once
from lapse.reconciler import reconcile_once
from tests.fixtures.pipeline import make_pipeline_settings

NOW = datetime.now(UTC).replace(microsecond=0)
KINDS = """
kinds:
  purge-export:
    table: files.exports
    id: id
    due: expires_at
    effect:
      delete: {}
"""
# Due first, and more of them than a sweep page (3) or a reconciler page (4).
UNKEYABLE = ["has space", "a:b", "caf\u00e9", "line\nbreak", "x" * 129, "semi;colon", "tab\there"]
KEYABLE = ["export-1", "export.2", "dir/export-3", "EXPORT_4"]


def test_rows_whose_ids_cannot_form_an_op_key_are_set_aside_and_the_rest_swept(kafka_bootstrap, pg_url, unique,
                                                                                 tmp_path, caplog):
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA files")
        conn.exec_driver_sql("CREATE TABLE files.exports (id text PRIMARY KEY, expires_at timestamptz NOT NULL)")
        conn.exec_driver_sql("CREATE INDEX exports_due ON files.exports (expires_at, id)")
        conn.execute(text("INSERT INTO files.exports VALUES (:id, :due)"),
                     [{"id": i, "due": NOW - timedelta(hours=2, minutes=n)} for n, i in enumerate(UNKEYABLE)]
                     + [{"id": i, "due": NOW - timedelta(hours=1)} for i in KEYABLE])
    path = tmp_path / "kinds.yaml"
    path.write_text(KINDS)
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, kinds={"file": path},
                                      producer={"sweep_page_size": 3}, reconciler={"page_size": 4, "grace_s": 0})
    kinds = load_kinds(settings, engine)
    producer, codec = make_producer(settings), Codec.from_settings(settings)
    try:
        swept = sweep_once(engine, producer, codec, settings, kinds)
        assert swept.by_kind == {"purge-export": len(KEYABLE)}
        assert swept.unkeyable == len(UNKEYABLE)
        with engine.connect() as conn:
            keys = set(conn.execute(select(cleanup_ledger.c.op_key)).scalars())
        assert keys == {f"purge-export:{i}" for i in KEYABLE}

        with engine.begin() as conn:  # the ledger forgets the keyable ones: the reconciler finds them
            conn.execute(cleanup_ledger.delete())
        reconciled = reconcile_once(engine, producer, codec, settings, kinds)
        assert reconciled.gaps["no_ledger"] == len(KEYABLE)  # (then stuck at once, with no grace)
        assert reconciled.anomalies == {"unkeyable_id": len(UNKEYABLE)}
        logged = [r.subject_id for r in caplog.records if hasattr(r, "subject_id")]
        assert len(logged) == 2 * len(UNKEYABLE)  # each set aside once by each pass, escaped to one line
        assert "line\\u000abreak" in logged and "tab\\u0009here" in logged
    finally:
        producer.flush(10)
        engine.dispose()
