"""The reconciler on Apache Kafka and PostgreSQL: gaps behind the pipeline's back, a sweep whose
produce failed, a race with the sweep; final state in the ledger, the business rows and the topic."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import func, insert, select

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_tables import reservations
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryFailed, make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.models import cleanup_ledger, ledger_transitions
from lapse.kernel.rate_limit import TokenBucket
from lapse.producers.sweep import sweep_once
from lapse.reconciler.scan import Reconciler, reconcile_once, scan_rate
from lapse.shell.app import main
from tests.fixtures.kafka import read_topic
from tests.fixtures.workers import process_until_done

KIND = "release-reservation"


def keys_on_topic(p, topic=None) -> list[str]:
    records = read_topic(p.settings.kafka.bootstrap_servers, topic or p.settings.topology.expiry)
    return [p.codec.decode_expected("expiry_event", m.value())["op_key"] for m in records]


def statuses(engine, ids) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(reservations.c.status).where(reservations.c.id.in_(ids))).scalars())


def reconciler(p, settings=None, clock=None) -> Reconciler:
    settings = settings or p.settings
    kwargs = {"clock": clock} if clock else {}
    return Reconciler(p.engine, make_producer(settings), p.codec, settings,
                      load_kinds(settings, p.engine), **kwargs)


def test_gaps_behind_the_pipelines_back_are_found_cleaned_and_then_gone(pipeline):
    p = pipeline
    now = datetime.now(UTC)
    with p.engine.begin() as conn:
        gaps = add_reservations(conn, 5, expires_at=now - timedelta(hours=1))
        add_reservations(conn, 3, expires_at=now + timedelta(hours=1))  # not due
        add_reservations(conn, 2, status="paid", expires_at=now - timedelta(hours=1))  # not eligible
        recent = add_reservations(conn, 2, expires_at=now - timedelta(seconds=10))  # inside grace
        (odd,) = add_reservations(conn, 1, expires_at=now - timedelta(hours=1))
        conn.execute(insert(cleanup_ledger).values(
            op_key=f"{KIND}:{odd}", kind=KIND, tenant="t", subject_id=str(odd), state="applied",
            due_at=now - timedelta(hours=1), correlation_id="c", source="sweep",
            created_at=now, updated_at=now))

    first = reconciler(p).run_once()
    assert first.gaps == {"no_ledger": 5}
    assert first.reemitted == 5
    assert first.anomalies == {"applied_but_eligible": 1}
    assert first.anomaly_keys == [f"{KIND}:{odd}"]
    assert sorted(keys_on_topic(p)) == sorted(f"{KIND}:{i}" for i in gaps)

    process_until_done(p.settings)
    assert statuses(p.engine, gaps) == {"released"}
    assert statuses(p.engine, recent) == {"held"}  # the sweep's job, not yet the reconciler's
    with p.engine.connect() as conn:
        rows = conn.execute(select(cleanup_ledger.c.state, cleanup_ledger.c.source).where(
            cleanup_ledger.c.subject_id.in_([str(i) for i in gaps]))).all()
    assert rows == [("applied", "reconciler")] * 5

    second = reconciler(p).run_once()
    assert (second.gaps, second.reemitted) == ({}, 0)
    assert second.anomalies == {"applied_but_eligible": 1}  # reported again, never "fixed"
    assert len(keys_on_topic(p)) == 5


def test_sweep_whose_produce_failed_is_recovered_after_the_grace_period_only(pipeline):
    p = pipeline
    t0 = datetime.now(UTC).replace(microsecond=0)
    with p.engine.begin() as conn:
        ids = add_reservations(conn, 3, expires_at=t0 - timedelta(minutes=1))
    dead = p.settings.with_(kafka={"bootstrap_servers": "127.0.0.1:1"})
    producer = make_producer(dead, **{"message.timeout.ms": 1000})
    with pytest.raises(DeliveryFailed):
        sweep_once(p.engine, producer, p.codec, dead, load_kinds(dead, p.engine), clock=lambda: t0)
    with p.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(cleanup_ledger)
                            .where(cleanup_ledger.c.state == "pending")).scalar() == 3

    grace = p.settings.reconciler.grace_s
    early = reconciler(p, clock=lambda: t0 + timedelta(seconds=grace - 1)).run_once()
    assert (early.gaps, early.reemitted) == ({}, 0)
    assert keys_on_topic(p) == []

    late = reconciler(p, clock=lambda: t0 + timedelta(seconds=grace + 1)).run_once()
    assert late.gaps == {"stuck_pending": 3}
    assert sorted(keys_on_topic(p)) == sorted(f"{KIND}:{i}" for i in ids)
    with p.engine.connect() as conn:
        audit = conn.execute(select(ledger_transitions.c.reason, ledger_transitions.c.actor)).all()
    assert audit == [("stuck_pending", "reconciler")] * 3

    again = reconciler(p, clock=lambda: t0 + timedelta(seconds=grace + 2)).run_once()
    assert again.reemitted == 0  # just re-emitted: it gets another grace period


def test_reconciler_racing_the_sweep_still_gives_one_effect_per_op_key(pipeline):
    p = pipeline
    now = datetime.now(UTC)
    with p.engine.begin() as conn:
        ids = add_reservations(conn, 300, expires_at=now - timedelta(hours=1))
    settings = p.settings.with_(reconciler={"grace_s": 0.0, "page_size": 50}, producer={"sweep_page_size": 50})
    start = threading.Barrier(2)
    out = {}

    def sweep():
        start.wait()
        out["sweep"] = sweep_once(p.engine, make_producer(settings), p.codec, settings,
                                  load_kinds(settings, p.engine))

    def reconcile():
        start.wait()
        out["reconcile"] = reconcile_once(p.engine, make_producer(settings), p.codec, settings,
                                          load_kinds(settings, p.engine))

    threads = [threading.Thread(target=sweep), threading.Thread(target=reconcile)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # ON CONFLICT DO NOTHING: each op key's pending row was created by exactly one of them.
    assert out["sweep"].emitted + out["reconcile"].gaps.get("no_ledger", 0) == 300

    process_until_done(p.settings)
    assert statuses(p.engine, ids) == {"released"}
    with p.engine.connect() as conn:
        applied = conn.execute(
            select(ledger_transitions.c.op_key, func.count())
            .where(ledger_transitions.c.to_state == "applied")
            .group_by(ledger_transitions.c.op_key)).all()
        states = conn.execute(select(cleanup_ledger.c.state, func.count())
                              .group_by(cleanup_ledger.c.state)).all()
    assert len(applied) == 300 and {n for _, n in applied} == {1}
    assert states == [("applied", 300)]
    assert len(keys_on_topic(p)) >= 300


def test_token_bucket_paces_a_burst_without_real_sleeping():
    now = [0.0]
    bucket = TokenBucket(100, burst=10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    bucket.acquire(10)
    assert now[0] == 0.0
    bucket.acquire(50)
    assert now[0] == pytest.approx(0.5)
    now[0] += 0.05
    bucket.acquire(5)
    assert now[0] == pytest.approx(0.55)


def test_bad_grace_is_a_one_line_error():
    result = CliRunner().invoke(main, ["reconcile", "--once", "--grace", "five minutes"])
    assert result.exit_code == 2
    assert "'five minutes' is not a duration like 30s, 15m, 2h or 1d" in result.output
    assert "Traceback" not in result.output


def test_codec_reads_what_the_reconciler_writes(pipeline):
    """Guard: the reconciler's records carry source=reconciler and the ledger's correlation id."""
    p = pipeline
    now = datetime.now(UTC)
    with p.engine.begin() as conn:
        (rid,) = add_reservations(conn, 1, expires_at=now - timedelta(hours=1))
    reconcile_once(p.engine, make_producer(p.settings), Codec.from_settings(p.settings), p.settings,
                   load_kinds(p.settings, p.engine))
    (msg,) = read_topic(p.settings.kafka.bootstrap_servers, p.settings.topology.expiry)
    record = p.codec.decode_expected("expiry_event", msg.value())
    with p.engine.connect() as conn:
        corr = conn.execute(select(cleanup_ledger.c.correlation_id)).scalar()
    assert (record["source"], record["correlation_id"], msg.key()) == (
        "reconciler", corr, f"{KIND}:{rid}".encode())


def test_one_pass_on_sqlite_finds_gaps_stuck_rows_and_anomalies(kafka_bootstrap, sqlite_url, unique):
    """The embedded default database runs the same statements (row values, UPDATE … RETURNING)."""
    from lapse.kernel.database import make_engine
    from tests.fixtures.pipeline import Pipeline, connection_env, make_pipeline_settings

    settings = make_pipeline_settings(kafka_bootstrap, sqlite_url, unique)
    p = Pipeline(settings, make_engine(sqlite_url), Codec.from_settings(settings))
    now = datetime.now(UTC)
    long_ago = now - timedelta(hours=1)
    with p.engine.begin() as conn:
        gaps = add_reservations(conn, 2, expires_at=long_ago)
        stuck, odd = add_reservations(conn, 2, expires_at=long_ago)
        for rid, state in ((stuck, "pending"), (odd, "applied")):
            conn.execute(insert(cleanup_ledger).values(
                op_key=f"{KIND}:{rid}", kind=KIND, tenant="t", subject_id=str(rid), state=state,
                due_at=long_ago, correlation_id="c", source="sweep", created_at=long_ago,
                updated_at=long_ago))
    first, rate = scan_rate(p.engine, make_producer(settings), p.codec, settings, load_kinds(settings, p.engine))
    assert first.gaps == {"no_ledger": 2, "stuck_pending": 1}
    assert first.anomaly_keys == [f"{KIND}:{odd}"]
    assert rate > 0
    assert sorted(keys_on_topic(p)) == sorted(f"{KIND}:{i}" for i in [*gaps, stuck])
    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_FORMAT": "text"}
    second = CliRunner().invoke(main, ["reconcile", "--once", "--grace", "5m", "--json"], env=env)
    assert second.exit_code == 0, second.output
    summary = json.loads(second.stdout)
    assert (summary["reemitted"], summary["anomalies"]) == (0, {"applied_but_eligible": 1})
    p.engine.dispose()
