"""The Quix Streams peer: what a competent team writes in a day with Quix Streams for the bench's
cleanup, run by `quix_stage` in an environment of its own (quixstreams pins confluent-kafka below
the version Lapse uses, so it cannot share Lapse's): `python quix_peer.py` with its arguments as
JSON on stdin. It imports nothing of Lapse.

A Quix application reads the stage's expiry topic in the stage's cleanup group; a deserializer
decodes each record (Avro single-object encoding: the 10-byte header, then the body, read with
fastavro into the writer schema it is given) and checks its fields' types; a `BatchingSink` writes
each checkpoint's batch per partition with the bench's set-based SQL (`bound.SetBasedSql`: one
binary COPY into a temporary table and one statement, one transaction), and Quix commits the
offsets after the sink has written. It runs until stopped.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import fastavro
import psycopg
from quixstreams import Application  # type: ignore[import-not-found,unused-ignore]
from quixstreams.models.serializers import Deserializer  # type: ignore[import-not-found,unused-ignore]
from quixstreams.sinks import BatchingSink, SinkBatch  # type: ignore[import-not-found,unused-ignore]

HEADER = 10  # Avro single-object encoding: C3 01, then the 8-byte schema fingerprint
TEXT_FIELDS = ("op_key", "kind", "tenant", "subject_id", "correlation_id", "source")


class ExpiryEventDeserializer(Deserializer):  # type: ignore[misc,unused-ignore]
    """Single-object Avro to a dict, every field's type checked (a record that fails raises)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        super().__init__()
        self.schema = fastavro.parse_schema(schema)

    def __call__(self, value: bytes, ctx: Any) -> dict[str, Any]:
        if value[:2] != b"\xc3\x01":
            raise ValueError("not an Avro single-object record")
        record = fastavro.schemaless_reader(io.BytesIO(value[HEADER:]), self.schema, None)
        if not isinstance(record, dict):
            raise ValueError("an expiry event that is not a record")
        if not all(isinstance(record.get(name), str) and record[name] for name in TEXT_FIELDS) \
                or not isinstance(record.get("attempt"), int) or record.get("due_at") is None:
            raise ValueError(f"an expiry event with missing or mistyped fields: {record.get('op_key')!r}")
        return record


class LedgerSink(BatchingSink):  # type: ignore[misc,unused-ignore]
    """Each partition's batch in one transaction: COPY into the batch table, one set-based statement."""

    def __init__(self, args: dict[str, Any]) -> None:
        super().__init__()
        self.args = args
        self.sql = args["sql"]
        self.conn: psycopg.Connection[Any] | None = None

    def setup(self) -> None:
        self.conn = psycopg.connect(self.args["dsn"])
        self.conn.execute(self.sql["create_batch"])
        self.conn.commit()

    def write(self, batch: SinkBatch) -> None:
        assert self.conn is not None
        rows = [(r["op_key"], r["kind"], r["tenant"], r["subject_id"], int(r["subject_id"]), r["due_at"],
                 int(r["due_at"].timestamp() * 1000), r["correlation_id"], r["source"], r["attempt"],
                 r.get("replay_id"), batch.topic, batch.partition, item.offset)
                for item in batch for r in (item.value,)]
        with self.conn.cursor() as cur:
            with cur.copy(self.sql["copy_batch"]) as copy:
                copy.set_types(self.args["types"])
                for row in rows:
                    copy.write_row(row)
            cur.execute(self.sql["claim_and_apply"], {"worker": self.args["worker"], "topic": self.args["outcomes"]})
            unreleased = [key for (key,) in cur.fetchall()]
            if unreleased:
                cur.execute(self.sql["skip"], {"keys": unreleased, "worker": self.args["worker"],
                                               "topic": self.args["outcomes"]})
        self.conn.commit()


def main() -> None:
    args = json.load(sys.stdin)
    app = Application(broker_address=args["bootstrap"], consumer_group=args["group"],
                      auto_offset_reset="earliest", commit_every=args["commit_every"], commit_interval=1.0,
                      auto_create_topics=False, use_changelog_topics=False, loglevel="WARNING",
                      state_dir=args["state_dir"])
    topic = app.topic(args["topic"], key_deserializer="bytes",
                      value_deserializer=ExpiryEventDeserializer(json.loads(args["schema"])))
    app.dataframe(topic).sink(LedgerSink(args))
    app.run()


if __name__ == "__main__":
    main()
