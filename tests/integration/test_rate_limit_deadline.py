"""Rate-limited deferrals end, and a lease takeover repeats a call only as an idempotent repeat.

On a real database, no broker, a fake clock: each delivery is what a worker does (claim, run the
leased effect, complete), the next one at the ledger's due time. The artifact-delete kind runs
through a scripted store whose deletes fail as the test says (the filesystem store underneath).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select

from lapse.devtools.demo_tables import artifacts
from lapse.kernel.kinds import CleanupKind, compile_kinds, read_kinds_file
from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.ledger import ExpiryEvent, Selection, expiry_event, release_dead_letters
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.processors.effect_calls import CallerFactory, build_caller
from lapse.processors.effects.object_stores import FilesystemObjectStore
from lapse.processors.failures import AMBIGUOUS, RATE_LIMITED, TEMPORARY, EffectFailure
from lapse.processors.leased import EffectRunner, complete, run_leased
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchScope
from tests.fixtures.effects import Answer, due_rows_table
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.topology import repo_topology

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TOPOLOGY = repo_topology()
KIND = "artifact-delete"
TERMINAL = ("applied", "dead_letter")


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Script:
    """A store whose deletes follow `steps` in a cycle: a failure is raised, None deletes. Every
    call is kept (op key, attempt) as the effect received it."""

    inner: FilesystemObjectStore
    steps: list[Exception | None]
    calls: list[tuple[str, int]]

    def caller(self, kind: CleanupKind):
        def call(c: EffectCall) -> None:
            step = self.steps[len(self.calls) % len(self.steps)]
            self.calls.append((c.op_key, c.attempt))
            if step is not None:
                raise step
            self.inner.delete(c.target["object_key"])
        return call


@pytest.fixture
def store(tmp_path) -> FilesystemObjectStore:
    return FilesystemObjectStore(tmp_path / "objects")


def kinds_with(engine, **fields) -> dict[str, CleanupKind]:
    kinds = demo_kinds(engine)
    return {**kinds, KIND: replace(kinds[KIND], **fields)}


def add_artifact(engine, store, key: str) -> ExpiryEvent:
    with engine.begin() as conn:
        aid = conn.execute(insert(artifacts).values(
            tenant="t1", object_key=key, status="live", retain_until=T0 - timedelta(hours=1),
        ).returning(artifacts.c.id)).scalar()
    store.put(key, b"x")
    return expiry_event(KIND, aid, "t1", T0 - timedelta(hours=1), source="sweep", correlation_id=f"c{aid}")


def scope(conn, kinds, worker: str, now: datetime) -> BatchScope:
    return BatchScope(conn, kinds=kinds, topics=TOPOLOGY, worker=worker, now=now, lease=LEASE,
                      rng=random.Random(1))


def deliver(engine, kinds, event: ExpiryEvent, script: Script | CallerFactory, clock: Clock, worker: str = "w1"):
    """One delivery as the worker does it: claim, run the leased effect, complete; returns both
    transactions' results (what the claim decided, what the completion recorded)."""
    runner = EffectRunner(script.caller if isinstance(script, Script) else script, concurrency=1)
    try:
        with engine.connect() as conn:
            batch = scope(conn, kinds, worker, clock())
            with conn.begin():
                first = apply_batch(batch, [event])
            return first, run_leased(runner, batch, first, clock)
    finally:
        runner.close()


def row(engine, op_key: str):
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == op_key)).mappings().one()


def transitions(engine, op_key: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(ledger_transitions.c.from_state, ledger_transitions.c.to_state, ledger_transitions.c.attempt,
                   ledger_transitions.c.failure_class)
            .where(ledger_transitions.c.op_key == op_key).order_by(ledger_transitions.c.id))]


def dead_letter_records(engine, op_key: str) -> list[dict]:
    with engine.connect() as conn:
        return [r["payload"] for r in conn.execute(select(outbox).where(outbox.c.topic == TOPOLOGY.dlq))
                .mappings() if r["key"] == op_key]


def next_delivery(engine, event: ExpiryEvent, clock: Clock) -> ExpiryEvent:
    """The wake-up the ledger scheduled, delivered when due (the clock moved there)."""
    r = row(engine, event.op_key)
    clock.now = max(r["due_at"], clock.now + timedelta(seconds=1))  # a delivery takes a moment
    return event._replace(due_at=r["due_at"], attempt=r["attempt"], source="retry")


def test_429s_defer_by_retry_after_until_the_deadline_then_dead_letter_with_the_history(engine, store):
    kinds = kinds_with(engine, rate_limited_for_s=600)
    event = add_artifact(engine, store, "exports/limited.csv")
    script = Script(store, [EffectFailure(RATE_LIMITED, "429 slow down", retry_after=60)], [])
    clock = Clock()
    for n in range(10):  # T0, T0+60 s, …, T0+540 s: before the deadline, each deferred by exactly 60 s
        _, done = deliver(engine, kinds, event, script, clock)
        r = row(engine, event.op_key)
        assert done.retried == [event.op_key], n
        assert (r["state"], r["attempt"], r["due_at"]) == ("retry_scheduled", 0, clock.now + timedelta(seconds=60))
        clock.now = r["due_at"]
        event = event._replace(due_at=r["due_at"], source="retry")
    assert clock.now == T0 + timedelta(seconds=600)
    _, done = deliver(engine, kinds, event, script, clock)  # the first 429 at the deadline ends it
    assert done.dead_lettered == [event.op_key]
    r = row(engine, event.op_key)
    assert (r["state"], r["attempt"], r["last_failure_class"]) == ("dead_letter", 0, "rate_limited")
    assert r["last_failure"].startswith(
        "rate limited 11 times since 2026-11-29T12:00:00+00:00, past the kind's 600 s deadline; last: 429 slow down")
    (dlq,) = dead_letter_records(engine, event.op_key)
    assert dlq["failure_class"] == "rate_limited"
    assert [h["failure_class"] for h in dlq["history"]] == ["rate_limited"] * 11
    assert store.exists("exports/limited.csv") and len(script.calls) == 11


def test_a_replay_starts_a_new_deadline(engine, store):
    kinds = kinds_with(engine, rate_limited_for_s=60)
    event = add_artifact(engine, store, "exports/replayed.csv")
    script = Script(store, [EffectFailure(RATE_LIMITED, "429", retry_after=60)], [])
    clock = Clock()
    while row_state(engine, event.op_key) not in TERMINAL:
        deliver(engine, kinds, event, script, clock)
        event = next_delivery(engine, event, clock)
    assert row(engine, event.op_key)["last_failure_class"] == "rate_limited"
    clock.now += timedelta(days=2)  # an operator replays it much later
    with engine.begin() as conn:
        (released,) = release_dead_letters(conn, Selection(op_keys=(event.op_key,)), 1, "r-1", clock.now)
    replayed = event._replace(due_at=released.due_at, attempt=0, replay_id="r-1", source="replay")
    _, done = deliver(engine, kinds, replayed, script, clock)  # its first 429: deferred, not dead
    assert done.retried == [event.op_key]
    r = row(engine, event.op_key)
    assert (r["state"], r["due_at"]) == ("retry_scheduled", clock.now + timedelta(seconds=60))


def test_other_failures_in_between_do_not_restart_the_deadline(engine, store):
    kinds = kinds_with(engine, rate_limited_for_s=100, max_attempts=10)
    event = add_artifact(engine, store, "exports/mixed.csv")
    script = Script(store, [EffectFailure(RATE_LIMITED, "429", retry_after=40), EffectFailure(TEMPORARY, "503")], [])
    clock = Clock()
    while row_state(engine, event.op_key) not in TERMINAL:
        deliver(engine, kinds, event, script, clock)
        event = next_delivery(engine, event, clock)
    r = row(engine, event.op_key)
    assert (r["state"], r["last_failure_class"]) == ("dead_letter", "rate_limited")
    assert r["last_failure"].startswith("rate limited ") and "since 2026-11-29T12:00:00+00:00" in r["last_failure"]
    assert r["attempt"] < 10  # ended by the deadline, not the attempt cap


def row_state(engine, op_key: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger.c.state).where(cleanup_ledger.c.op_key == op_key)).scalar()


MAX_ATTEMPTS = 4
DEADLINE_S = 60
FAILURES = st.one_of(
    st.none(),  # the delete goes through
    st.builds(lambda s: EffectFailure(RATE_LIMITED, "429", retry_after=s), st.one_of(st.none(), st.integers(1, 90))),
    st.just(EffectFailure(TEMPORARY, "503")),
    st.just(EffectFailure(AMBIGUOUS, "timed out")),
)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(FAILURES, min_size=1, max_size=6))
def test_every_operation_ends_within_max_attempts_and_the_deadline(engine, store, steps):
    """Whatever the far side answers, in a cycle for ever: the operation ends applied or dead
    lettered; once the rate-limit deadline (from the first failure) has passed, at most
    max_attempts more tries run; the attempt count never passes the cap; the effect lands once at
    most. Each example is a new artifact (its own op key) in the test's database."""
    kinds = kinds_with(engine, rate_limited_for_s=DEADLINE_S, max_attempts=MAX_ATTEMPTS, retry_base_s=5,
                       retry_cap_s=30)
    key = f"exports/{random.getrandbits(64):x}.csv"
    event = add_artifact(engine, store, key)
    script = Script(store, list(steps), [])
    clock = Clock()
    first_failure: datetime | None = None
    past_deadline = 0
    for _ in range(1000):  # a guard: the bound below is what the test checks
        if first_failure is not None and clock.now >= first_failure + timedelta(seconds=DEADLINE_S):
            past_deadline += 1
        calls = len(script.calls)
        deliver(engine, kinds, event, script, clock)
        if first_failure is None and script.steps[calls % len(steps)] is not None:
            first_failure = clock.now
        if row_state(engine, event.op_key) in TERMINAL:
            break
        event = next_delivery(engine, event, clock)
    r = row(engine, event.op_key)
    assert r["state"] in TERMINAL
    assert past_deadline <= MAX_ATTEMPTS
    assert r["attempt"] <= MAX_ATTEMPTS
    assert (r["state"] == "applied") == (not store.exists(key))
    if r["last_failure_class"] == "rate_limited" and r["state"] == "dead_letter":
        assert first_failure is not None and clock.now >= first_failure + timedelta(seconds=DEADLINE_S)
        limited = sum(1 for i in range(len(script.calls)) if isinstance(steps[i % len(steps)], EffectFailure)
                      and steps[i % len(steps)].failure_class == RATE_LIMITED)
        assert f"rate limited {limited} times since " in r["last_failure"]


# --- the takeover path ------------------------------------------------------------------------

def crash_after_call(engine, kinds, event: ExpiryEvent, script: Script | CallerFactory, worker: str,
                     now: datetime):
    """A holder that claims, calls the effect, and dies before completing: the row stays claimed."""
    with engine.connect() as conn:
        batch = scope(conn, kinds, worker, now)
        with conn.begin():
            first = apply_batch(batch, [event])
    runner = EffectRunner(script.caller if isinstance(script, Script) else script, concurrency=1)
    try:
        jobs = [(kinds[e.kind], EffectCall(e.kind, e.op_key, first.attempts[e.op_key], e.subject_id, e.tenant,
                                           first.targets[e.op_key])) for e in first.leased]
        outcomes = runner.run(jobs, LEASE.total_seconds(), lambda keys: None)
    finally:
        runner.close()
    return first, outcomes


def test_a_takeover_calls_again_with_the_same_op_key_and_a_higher_attempt_and_records_one_effect(engine, store):
    kinds = demo_kinds(engine)
    event = add_artifact(engine, store, "exports/taken.csv")
    script = Script(store, [None], [])
    first, outcomes = crash_after_call(engine, kinds, event, script, "wa", T0)
    assert not store.exists("exports/taken.csv") and row_state(engine, event.op_key) == "claimed"
    # wb, after wa's lease ran out, takes the row over and calls again: same op key, attempt 2.
    _, done = deliver(engine, kinds, event, script, Clock(T0 + LEASE + timedelta(seconds=1)), worker="wb")
    assert done.applied == [event.op_key]
    assert script.calls == [(event.op_key, 1), (event.op_key, 2)]
    # wa comes back and completes late: the row is no longer its own, nothing is recorded.
    with engine.connect() as conn, conn.begin():
        late = complete(scope(conn, kinds, "wa", T0 + LEASE + timedelta(seconds=2)), first.leased, outcomes)
    assert late.lost == [event.op_key] and late.applied == []
    r = row(engine, event.op_key)
    assert (r["state"], r["attempt"]) == ("applied", 2)
    assert transitions(engine, event.op_key) == [
        ("pending", "claimed", 0, None), ("claimed", "claimed", 1, None), ("claimed", "applied", 2, None)]
    with engine.connect() as conn:
        assert conn.execute(select(artifacts.c.status).where(artifacts.c.object_key == "exports/taken.csv")
                            ).scalar() == "deleted"


def test_a_takeover_of_a_non_idempotent_effect_is_a_dead_letter_not_a_second_call(engine, store):
    kinds = kinds_with(engine, idempotent_effect=False)
    event = add_artifact(engine, store, "exports/once.csv")
    script = Script(store, [None], [])
    crash_after_call(engine, kinds, event, script, "wa", T0)
    first, done = deliver(engine, kinds, event, script, Clock(T0 + LEASE + timedelta(seconds=1)), worker="wb")
    assert first.dead_lettered == [event.op_key] and first.leased == [] and done.applied == []
    assert script.calls == [(event.op_key, 1)]  # never called again
    r = row(engine, event.op_key)
    assert (r["state"], r["attempt"], r["last_failure_class"]) == ("dead_letter", 1, "ambiguous")
    assert "the lease of wa ran out while its call may have run" in r["last_failure"]
    assert "not idempotent" in r["last_failure"]


def test_takeovers_end_when_the_lost_attempt_was_the_last(engine, store):
    kinds = kinds_with(engine, max_attempts=2)
    event = add_artifact(engine, store, "exports/crashy.csv")
    script = Script(store, [TimeoutError("the worker died mid-call")], [])
    clock = T0
    crash_after_call(engine, kinds, event, script, "wa", clock)
    clock += LEASE + timedelta(seconds=1)
    crash_after_call(engine, kinds, event, script, "wb", clock)  # attempt 2 (the first one lost)
    clock += LEASE + timedelta(seconds=1)
    first, _ = deliver(engine, kinds, event, script, Clock(clock), worker="wc")
    assert first.dead_lettered == [event.op_key] and first.leased == []
    assert script.calls == [(event.op_key, 1), (event.op_key, 2)]
    r = row(engine, event.op_key)
    assert (r["state"], r["attempt"], r["last_failure_class"]) == ("dead_letter", 2, "exhausted")


hooks = due_rows_table("takeover_hooks", "open")


def test_an_http_takeover_sends_the_same_idempotency_key_with_a_higher_attempt(engine, http_server, tmp_path):
    """The declared http effect: wa's POST lands and wa dies; wb's repeat carries the same
    Idempotency-Key (the op key) and Lapse-Attempt 2, and the ledger records the effect once."""
    http_server.script("hook", Answer(200))
    hooks.create(engine)
    with engine.begin() as conn:
        conn.execute(hooks.insert(), [{"id": 1, "tenant": "t1", "status": "open", "due_at": T0 - timedelta(hours=1)}])
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump({"kinds": {"notify": {
        "table": "public.takeover_hooks", "id": "id", "tenant": "tenant", "due": "due_at",
        "eligible": {"status": "open"},
        "effect": {"http": {"url": http_server.url + "/hooks/hook/{subject_id}", "then_set": {"status": "done"}}},
    }}}))
    kinds = compile_kinds(read_kinds_file(path), engine)
    event = expiry_event("notify", 1, "t1", T0 - timedelta(hours=1), source="sweep", correlation_id="c1")
    _, outcomes = crash_after_call(engine, kinds, event, build_caller, "wa", T0)
    assert outcomes == {event.op_key: None}  # the call landed; wa dies before recording it
    _, done = deliver(engine, kinds, event, build_caller, Clock(T0 + LEASE + timedelta(seconds=1)), worker="wb")
    assert done.applied == [event.op_key]
    sent = http_server.requests_for(event.op_key)
    assert [(r.headers["idempotency-key"], r.headers["lapse-attempt"]) for r in sent] == [
        (event.op_key, "1"), (event.op_key, "2")]
    r = row(engine, event.op_key)
    assert (r["state"], r["attempt"]) == ("applied", 2)
    assert [t[1] for t in transitions(engine, event.op_key)].count("applied") == 1
    with engine.connect() as conn:
        assert conn.execute(select(hooks.c.status)).scalar() == "done"
