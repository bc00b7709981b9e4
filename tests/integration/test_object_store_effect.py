"""The declared `object-store` effect against moto's S3 server (started by the test), on a real database.

Objects are deleted once each; a second delivery of the same events is absorbed by the ledger
with no second DeleteObject; a redo after a lost completion deletes again harmlessly; a missing
object is success; a key S3 can never hold is dead-lettered without a call.
"""

from __future__ import annotations

import random
import socket
import uuid
from datetime import UTC, datetime, timedelta

import yaml
from sqlalchemy import BigInteger, Column, DateTime, Index, MetaData, Table, Text, select, text

from lapse.kernel.kinds import CleanupKind, compile_kinds, read_kinds_file
from lapse.kernel.ledger import ExpiryEvent, expiry_event
from lapse.kernel.models import cleanup_ledger
from lapse.processors.effect_calls import build_caller
from lapse.processors.leased import EffectRunner, run_leased
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchResult, BatchScope
from tests.fixtures.topology import repo_topology

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TOPOLOGY = repo_topology()
KIND = "purge-export"

exports = Table(
    "exports", MetaData(),
    Column("id", BigInteger, primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("object_key", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("retain_until", DateTime(timezone=True), nullable=False),
    Index("ix_exports_due", "retain_until", "id", postgresql_where=text("status = 'live'")),
    schema="public",  # named: the engine maps unnamed schemas to Lapse's own
)


def export_kind(engine, tmp_path, url: str, endpoint_url: str) -> CleanupKind:
    """`purge-export` declared in a kinds file and compiled against the table: delete the object
    named by `object_key` under the URL, then `status: purged`."""
    declaration = {"kinds": {KIND: {
        "table": "public.exports", "id": "id", "tenant": "tenant", "due": "retain_until",
        "eligible": {"status": "live"},
        "effect": {"object-store": {"url": url, "key_column": "object_key", "endpoint_url": endpoint_url,
                                    "region": "us-east-1", "then_set": {"status": "purged"}}},
        "retry": {"max_attempts": 3, "base_s": 1.0, "cap_s": 10.0},
    }}}
    path = tmp_path / f"kinds-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(declaration))
    return compile_kinds(read_kinds_file(path), engine)[KIND]


def add_exports(engine, keys: list[str]) -> list[ExpiryEvent]:
    exports.create(engine, checkfirst=True)
    with engine.begin() as conn:
        conn.execute(exports.insert(), [{"id": i, "tenant": "t1", "object_key": k, "status": "live",
                                         "retain_until": T0 - timedelta(hours=1)} for i, k in enumerate(keys, 1)])
    return [expiry_event(KIND, i, "t1", T0 - timedelta(hours=1), source="sweep", correlation_id=f"c{i}")
            for i in range(1, len(keys) + 1)]


def scope(conn, kind: CleanupKind, now: datetime, worker: str = "w1") -> BatchScope:
    return BatchScope(conn, kinds={kind.name: kind}, topics=TOPOLOGY, worker=worker, now=now, lease=LEASE,
                      rng=random.Random(1))


def deliver(engine, runner: EffectRunner, kind: CleanupKind, events: list[ExpiryEvent], now: datetime = T0,
            worker: str = "w1") -> tuple[BatchResult, BatchResult]:
    """One delivery as the worker does it: claim, delete under the lease, complete."""
    with engine.connect() as conn:
        batch = scope(conn, kind, now, worker)
        with conn.begin():
            claimed = apply_batch(batch, events)
        return claimed, run_leased(runner, batch, claimed, lambda: now)


def states(engine) -> dict[str, tuple[str, int, str | None]]:
    with engine.connect() as conn:
        return {r["op_key"]: (r["state"], r["attempt"], r["last_failure_class"])
                for r in conn.execute(select(cleanup_ledger)).mappings()}


def statuses(engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(exports.c.id, exports.c.status)).all())


def test_objects_are_deleted_once_and_a_second_delivery_is_a_no_op(engine, moto_s3, tmp_path):
    bucket = moto_s3.bucket()
    for name in ("a.csv", "b.csv", "deep/c.csv"):
        moto_s3.client.put_object(Bucket=bucket, Key=f"exports/{name}", Body=b"x")
    moto_s3.client.put_object(Bucket=bucket, Key="other/keep.csv", Body=b"x")
    # d.csv was never written (or is gone already): its delete is a success all the same.
    events = add_exports(engine, ["a.csv", "b.csv", "deep/c.csv", "d.csv"])
    kind = export_kind(engine, tmp_path, f"s3://{bucket}/exports", moto_s3.endpoint_url)
    runner = EffectRunner(build_caller, concurrency=4)
    try:
        claimed, done = deliver(engine, runner, kind, events)
        assert len(claimed.leased) == 4 and sorted(done.applied) == sorted(e.op_key for e in events)
        assert moto_s3.keys(bucket) == {"other/keep.csv"}
        assert sorted(moto_s3.deletes(bucket)) == [("exports/a.csv", 204), ("exports/b.csv", 204),
                                                  ("exports/d.csv", 204), ("exports/deep/c.csv", 204)]

        again, done_again = deliver(engine, runner, kind, events, now=T0 + timedelta(minutes=5))
    finally:
        runner.close()
    assert again.duplicates == 4 and again.leased == [] and done_again.applied == []
    assert len(moto_s3.deletes(bucket)) == 4  # the ledger absorbed the second delivery: no call
    assert set(states(engine).values()) == {("applied", 1, None)}
    assert statuses(engine) == {1: "purged", 2: "purged", 3: "purged", 4: "purged"}


def test_a_redo_after_a_lost_completion_deletes_again_harmlessly(engine, moto_s3, tmp_path):
    """The first worker deleted the object and died before recording it; once its lease has run
    out, the next delivery deletes again (a no-op on S3) and records the effect once."""
    bucket = moto_s3.bucket()
    moto_s3.client.put_object(Bucket=bucket, Key="a.csv", Body=b"x")
    (event,) = add_exports(engine, ["a.csv"])
    kind = export_kind(engine, tmp_path, f"s3://{bucket}", moto_s3.endpoint_url)
    runner = EffectRunner(build_caller, concurrency=1)
    try:
        with engine.begin() as conn:
            crashed = apply_batch(scope(conn, kind, T0, "wa"), [event])
        moto_s3.client.delete_object(Bucket=bucket, Key="a.csv")  # wa's call landed, then wa died
        assert [e.op_key for e in crashed.leased] == [event.op_key]
        _, done = deliver(engine, runner, kind, [event], now=T0 + LEASE + timedelta(seconds=1), worker="wb")
    finally:
        runner.close()
    assert done.applied == [event.op_key]
    assert moto_s3.keys(bucket) == set() and moto_s3.deletes(bucket) == [("a.csv", 204), ("a.csv", 204)]
    # wa's lost attempt counts (the takeover's claim adds it): wb's redo is attempt 2.
    assert states(engine) == {event.op_key: ("applied", 2, None)}
    assert statuses(engine) == {1: "purged"}


def test_keys_s3_cannot_hold_and_a_missing_bucket_are_dead_lettered_as_invalid(engine, moto_s3, tmp_path):
    bucket = moto_s3.bucket()
    events = add_exports(engine, ["k" * 1025, ""])  # (a NUL cannot even reach PostgreSQL text)
    (missing_bucket,) = add_exports_more(engine, "x.csv")
    for url, batch in ((f"s3://{bucket}", events), ("s3://no-such-bucket-here", [missing_bucket])):
        runner = EffectRunner(build_caller, concurrency=2)
        try:
            deliver(engine, runner, export_kind(engine, tmp_path, url, moto_s3.endpoint_url), batch)
        finally:
            runner.close()
    assert moto_s3.deletes(bucket) == []  # checked before any call
    rows = states(engine)
    assert rows[events[0].op_key] == ("dead_letter", 1, "invalid")
    assert rows[events[1].op_key] == ("dead_letter", 1, "invalid")
    assert rows[missing_bucket.op_key] == ("dead_letter", 1, "invalid")
    assert statuses(engine) == {1: "live", 2: "live", 3: "live"}


def add_exports_more(engine, key: str) -> list[ExpiryEvent]:
    """One more export row after those already added (the next id)."""
    with engine.begin() as conn:
        next_id = conn.execute(select(exports.c.id).order_by(exports.c.id.desc())).scalars().first() + 1
        conn.execute(exports.insert(), [{"id": next_id, "tenant": "t1", "object_key": key, "status": "live",
                                         "retain_until": T0 - timedelta(hours=1)}])
    return [expiry_event(KIND, next_id, "t1", T0 - timedelta(hours=1), source="sweep", correlation_id="cx")]


def test_an_unreachable_endpoint_is_temporary_and_retried(engine, moto_s3, tmp_path):
    """No connection, so no request sent: a temporary failure, retried later; nothing recorded as done."""
    with socket.socket() as probe:  # a port on loopback that nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    (event,) = add_exports(engine, ["a.csv"])
    kind = export_kind(engine, tmp_path, "s3://some-bucket", f"http://127.0.0.1:{closed_port}")
    runner = EffectRunner(build_caller, concurrency=1)
    try:
        _, done = deliver(engine, runner, kind, [event])
    finally:
        runner.close()
    assert done.retried == [event.op_key]
    assert states(engine) == {event.op_key: ("retry_scheduled", 1, "temporary")}
    assert statuses(engine) == {1: "live"}
