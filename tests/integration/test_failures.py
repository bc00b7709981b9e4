"""Failure paths on a real database, no broker: leases, retries, Retry-After, dead letters.

Time is a fake clock; external effects use the filesystem object store (delete-if-present).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from lapse.devtools.demo_tables import artifacts
from lapse.kernel.database import make_engine
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent, expiry_event
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.processors.effects.object_stores import FaultyObjectStore, FilesystemObjectStore
from lapse.processors.failures import RATE_LIMITED, TEMPORARY, EffectFailure
from lapse.processors.leased import EffectRunner, run_leased
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchScope
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.topology import repo_topology, tier_covering

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TOPOLOGY = repo_topology()


def kinds(engine) -> dict[str, CleanupKind]:
    """The demo's kinds compiled against the test's database (their effects run through the
    test's stores, handed to the runner by `deleting`)."""
    return demo_kinds(engine)


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class ScriptedStore:
    """A store whose next deletes fail as scripted, then pass through to the filesystem store."""

    def __init__(self, inner: FilesystemObjectStore, failures: list[EffectFailure]) -> None:
        self.inner, self.failures, self.calls = inner, list(failures), 0

    def delete(self, key: str) -> bool:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.inner.delete(key)


@pytest.fixture
def engine(pg_url):
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture
def store(tmp_path) -> FilesystemObjectStore:
    return FilesystemObjectStore(tmp_path / "objects")


def add_artifact(engine, store, key="exports/a.csv", put=True) -> ExpiryEvent:
    with engine.begin() as conn:
        aid = conn.execute(insert(artifacts).values(
            tenant="t1", object_key=key, status="live", retain_until=T0 - timedelta(hours=1),
        ).returning(artifacts.c.id)).scalar()
    if put:
        store.put(key, b"x")
    return expiry_event("artifact-delete", aid, "t1", T0 - timedelta(hours=1), source="sweep",
                        correlation_id=f"c{aid}")


def scope(conn, worker, now) -> BatchScope:
    return BatchScope(conn, kinds=kinds(conn.engine), topics=TOPOLOGY, worker=worker, now=now, lease=LEASE,
                      rng=random.Random(1))


def claim(engine, events, worker, now):
    with engine.begin() as conn:
        return apply_batch(scope(conn, worker, now), events)


def deleting(store):
    """The runner's caller factory: every kind deletes its row's object_key from `store`."""
    return lambda kind: lambda call: store.delete(call.target["object_key"])


def deliver(engine, events, store, worker="w1", clock=None):
    """One delivery as the worker does it: claim, run the leased effects, complete."""
    clock = clock or Clock()
    runner = EffectRunner(deleting(store), concurrency=2)
    try:
        with engine.connect() as conn:
            batch = scope(conn, worker, clock())
            with conn.begin():
                first = apply_batch(batch, events)
            done = run_leased(runner, batch, first, clock)
    finally:
        runner.close()
    return first, done


def row(engine, op_key):
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == op_key)).mappings().one()


def history(engine, op_key):
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(ledger_transitions.c.from_state, ledger_transitions.c.to_state,
                   ledger_transitions.c.attempt, ledger_transitions.c.failure_class)
            .where(ledger_transitions.c.op_key == op_key).order_by(ledger_transitions.c.id))]


def outbox_rows(engine, *topics):
    with engine.connect() as conn:
        return [r for r in conn.execute(select(outbox).order_by(outbox.c.id)).mappings()
                if r["topic"] in topics]


def test_artifact_delete_runs_under_a_lease_and_completes(engine, store):
    ev = add_artifact(engine, store)
    first, done = deliver(engine, [ev], store)
    assert [e.op_key for e in first.leased] == [ev.op_key] and done.applied == [ev.op_key]
    assert not store.exists("exports/a.csv")
    assert row(engine, ev.op_key)["state"] == "applied"
    assert history(engine, ev.op_key) == [("pending", "claimed", 0, None), ("claimed", "applied", 1, None)]
    with engine.connect() as conn:
        assert conn.execute(select(artifacts.c.status)).scalar() == "deleted"


def test_two_workers_claim_one_external_job_one_effect_other_backs_off(engine, store):
    ev = add_artifact(engine, store)
    a = claim(engine, [ev], "wa", T0)
    b = claim(engine, [ev], "wb", T0 + timedelta(seconds=1))
    assert [e.op_key for e in a.leased] == [ev.op_key]
    assert b.leased == [] and b.conflicts == [ev.op_key]
    assert b.backed_off[0].due_at == T0 + LEASE  # wb waits in a delay tier until wa's lease ends
    runner = EffectRunner(deleting(store))
    with engine.connect() as conn:
        done = run_leased(runner, scope(conn, "wa", T0), a, Clock())
    runner.close()
    assert done.applied == [ev.op_key] and store.removed == 1
    # wb's wake-up after the lease finds the work done: a duplicate, no second effect.
    late = claim(engine, [b.backed_off[0]], "wb", T0 + LEASE)
    assert late.duplicates == 1 and late.leased == [] and store.removed == 1


def test_crash_after_effect_completes_on_next_delivery_without_second_effect(engine, store):
    ev = add_artifact(engine, store)
    crashed = claim(engine, [ev], "wa", T0)
    store.delete(crashed.targets[ev.op_key]["object_key"])  # the effect ran, then the process died
    assert row(engine, ev.op_key)["state"] == "claimed"
    early = claim(engine, [ev], "wb", T0 + timedelta(seconds=10))  # lease still live: backs off
    assert early.conflicts == [ev.op_key]
    _, done = deliver(engine, [ev], store, worker="wb", clock=Clock(T0 + LEASE + timedelta(seconds=1)))
    assert done.applied == [ev.op_key]
    assert store.removed == 1 and not store.exists("exports/a.csv")
    assert row(engine, ev.op_key)["state"] == "applied"
    assert [h[1] for h in history(engine, ev.op_key)].count("applied") == 1


def test_rate_limited_schedules_exactly_retry_after_and_keeps_the_attempt(engine, store):
    ev = add_artifact(engine, store)
    flaky = ScriptedStore(store, [EffectFailure(RATE_LIMITED, "429 Too Many Requests", retry_after=42)])
    _, done = deliver(engine, [ev], flaky)
    assert done.retried == [ev.op_key]
    r = row(engine, ev.op_key)
    assert (r["state"], r["attempt"], r["last_failure_class"]) == ("retry_scheduled", 0, "rate_limited")
    assert r["due_at"] == T0 + timedelta(seconds=42)
    (wake,) = outbox_rows(engine, *TOPOLOGY.delay_topics)
    assert wake["topic"] == tier_covering(TOPOLOGY, 42)  # the smallest tier covering 42 s
    assert wake["headers"]["lapse-due-at"] == str(int((T0 + timedelta(seconds=42)).timestamp() * 1000))
    assert wake["headers"]["lapse-target"] == TOPOLOGY.expiry


def test_restart_mid_backoff_hands_early_wakeup_back_then_applies_when_due(engine, store):
    ev = add_artifact(engine, store)
    _, done = deliver(engine, [ev], ScriptedStore(store, [EffectFailure(TEMPORARY, "503")]))
    assert done.retried == [ev.op_key]
    due = row(engine, ev.op_key)["due_at"]
    assert T0 < due <= T0 + timedelta(seconds=kinds(engine)["artifact-delete"].retry_base_s * 2)
    wake = _wakeup(engine, ev)
    # A fresh process (new runner, no memory) sees the wake-up before it is due: handed back.
    early = claim(engine, [wake], "w2", T0 + timedelta(milliseconds=1))
    assert [e.due_at for e in early.not_due] == [due] and early.leased == []
    assert row(engine, ev.op_key)["state"] == "retry_scheduled"
    # The original event redelivered mid-backoff is absorbed; it does not reset the schedule.
    stale = claim(engine, [ev], "w2", T0 + timedelta(milliseconds=2))
    assert stale.duplicates == 1 and row(engine, ev.op_key)["due_at"] == due
    _, done = deliver(engine, [wake], store, worker="w2", clock=Clock(due))
    assert done.applied == [ev.op_key] and row(engine, ev.op_key)["attempt"] == 2


def _wakeup(engine, ev) -> ExpiryEvent:
    """The wake-up record the retry put in the outbox, decoded back into an event."""
    (wake,) = outbox_rows(engine, *TOPOLOGY.delay_topics)
    p = wake["payload"]
    return expiry_event(p["kind"], p["subject_id"], p["tenant"], datetime.fromtimestamp(p["due_at"] / 1000, UTC),
                        source=p["source"], correlation_id=p["correlation_id"], attempt=p["attempt"])


def test_final_attempt_failure_is_dead_lettered_with_its_history(engine, store):
    ev = add_artifact(engine, store)
    cap = kinds(engine)["artifact-delete"].max_attempts
    flaky = ScriptedStore(store, [EffectFailure(TEMPORARY, f"503 try {i}") for i in range(cap)])
    clock = Clock()
    for _ in range(cap):
        deliver(engine, [ev], flaky, clock=clock)
        clock.now = row(engine, ev.op_key)["due_at"] + timedelta(seconds=1)
        r = row(engine, ev.op_key)
        ev = ev._replace(due_at=r["due_at"], attempt=r["attempt"])
    r = row(engine, ev.op_key)
    assert (r["state"], r["attempt"], r["last_failure_class"]) == ("dead_letter", cap, "exhausted")
    assert f"{cap} attempts failed" in r["last_failure"]
    (dlq,) = outbox_rows(engine, TOPOLOGY.dlq)
    assert [h["attempt"] for h in dlq["payload"]["history"]] == list(range(1, cap + 1))
    assert dlq["payload"]["history"][-1]["reason"] == f"503 try {cap - 1}"
    assert store.exists("exports/a.csv") and flaky.calls == cap
    assert [h[1] for h in history(engine, ev.op_key)].count("retry_scheduled") == cap - 1


def test_invalid_effect_failure_dead_letters_at_once(engine, store):
    ev = add_artifact(engine, store, key="../escape", put=False)
    _, done = deliver(engine, [ev], store)
    assert done.dead_lettered == [ev.op_key]
    r = row(engine, ev.op_key)
    assert (r["state"], r["attempt"], r["last_failure_class"]) == ("dead_letter", 1, "invalid")


def test_faulty_store_fails_a_share_of_deletes_with_classified_failures(store):
    faulty = FaultyObjectStore(store, rate=0.5, rng=random.Random(3))
    seen = []
    for i in range(200):
        store.put(f"o/{i}")
        try:
            faulty.delete(f"o/{i}")
            seen.append("ok")
        except EffectFailure as exc:
            seen.append(exc.failure_class)
            assert exc.retry_after == 2.0 if exc.failure_class == RATE_LIMITED else exc.retry_after is None
    assert set(seen) == {"ok", "rate_limited", "temporary", "invalid"}
    assert store.removed == seen.count("ok")
