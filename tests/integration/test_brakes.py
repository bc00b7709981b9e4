"""The brakes in a batch, on PostgreSQL and SQLite (docs/design/brakes.md): a paused kind or tenant,
an undeclared kind and work over a budget are held, never applied, dead-lettered or charged an
attempt; a redelivery while held is absorbed, not bounced; a resume (or the kind declared again)
releases each held operation once through the outbox, and it is then applied once. A budget lets
through at most its count, whatever the number of concurrent workers, and pauses its kind. A
shadow-mode kind records what live work would do and changes nothing; switched to live, each
operation is applied once. The whole pipeline under `lapse run`: tests/system/test_brakes_run.py."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta

from sqlalchemy import func, insert, select

from lapse.devtools.demo_tables import artifacts, reservations
from lapse.kernel.brakes import Budget, read_pauses
from lapse.kernel.findings import latest_findings
from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.ledger import expiry_event, mark_stuck
from lapse.kernel.models import budget_usage, cleanup_ledger, ledger_transitions, outbox, shadow_effects
from lapse.operator_actions import recent_actions, run_pause, run_resume
from lapse.processors.leased import EffectRunner, run_leased
from lapse.processors.rules import apply_batch
from lapse.reconciler import release_parked_work
from tests.fixtures.fast_path import (
    DELETE,
    NOW,
    RELEASE,
    TENANT,
    TOPOLOGY,
    engine_for,
    key,
    kinds_for,
    release_event,
    reservation,
    scope,
)


def clock():
    return NOW


def seed(engine, ids, tenant: str = TENANT, status: str = "held") -> None:
    with engine.begin() as conn:
        conn.execute(insert(reservations), [reservation(i, status=status, tenant=tenant) for i in ids])


def batch(engine, kinds, events, worker: str = "w1"):
    with engine.begin() as conn:
        return apply_batch(scope(conn, kinds, worker), events)


def ledger(engine, kind: str = RELEASE) -> dict[str, tuple[str, int]]:
    with engine.connect() as conn:
        rows = conn.execute(select(cleanup_ledger.c.op_key, cleanup_ledger.c.state, cleanup_ledger.c.attempt)
                            .where(cleanup_ledger.c.kind == kind))
        return {k: (s, a) for k, s, a in rows}


def statuses(engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(reservations.c.id, reservations.c.status)).all())


def applied_transitions(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(ledger_transitions.c.op_key, func.count())
                                 .where(ledger_transitions.c.to_state == "applied")
                                 .group_by(ledger_transitions.c.op_key)).all())


def released_events(engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(outbox.c.key).where(outbox.c.topic == TOPOLOGY.expiry,
                                                              outbox.c.schema == "expiry_event")).scalars())


def test_a_paused_kind_is_held_and_after_resume_applied_once_attempts_unchanged(db_url):
    engine, kinds = engine_for(db_url), kinds_for(db_url)
    seed(engine, [1, 2, 3])
    paused = run_pause(engine, RELEASE, None, reason="partner outage", actor="alice")
    assert paused["paused"] and paused["action_id"]

    held = batch(engine, kinds, [release_event(i) for i in (1, 2, 3)])
    assert sorted(held.held) == [key(RELEASE, i) for i in (1, 2, 3)] and held.applied == []
    assert set(statuses(engine).values()) == {"held"}  # no effect ran
    assert set(ledger(engine).values()) == {("held", 0)}  # no attempt charged
    # A redelivery while paused is absorbed, not handed to a delay tier (no hot loop).
    again = batch(engine, kinds, [release_event(i) for i in (1, 2, 3)])
    assert (again.duplicates, again.not_due, again.held) == (3, [], [])

    resumed = run_resume(engine, kinds, TOPOLOGY, RELEASE, None, reason="partner back", actor="alice", clock=clock)
    assert (resumed["resumed"], resumed["released"]) == (True, 3)
    assert set(ledger(engine).values()) == {("pending", 0)}
    assert released_events(engine) == [key(RELEASE, i) for i in (1, 2, 3)]
    done = batch(engine, kinds, [release_event(i) for i in (1, 2, 3)])
    assert sorted(done.applied) == [key(RELEASE, i) for i in (1, 2, 3)]
    assert set(ledger(engine).values()) == {("applied", 1)}  # as if never paused
    assert set(statuses(engine).values()) == {"released"}
    assert applied_transitions(engine) == {key(RELEASE, i): 1 for i in (1, 2, 3)}
    with engine.connect() as conn:
        actions = [(a.action, a.target, a.actor) for a in recent_actions(conn)]
    assert actions[:2] == [("resume", RELEASE, "alice"), ("pause", RELEASE, "alice")]


def test_pausing_twice_changes_nothing_and_resuming_what_is_not_paused_is_refused(db_url):
    engine = engine_for(db_url)
    first = run_pause(engine, RELEASE, None, reason="a", actor="alice")
    second = run_pause(engine, RELEASE, None, reason="b", actor="bob")
    assert (first["paused"], second["paused"]) == (True, False)
    assert second["pause"]["actor"] == "alice" and second["pause"]["reason"] == "a"
    gone = run_resume(engine, kinds_for(db_url), TOPOLOGY, RELEASE, "t9", reason="x", actor="bob")
    assert gone == {"resumed": False, "action_id": None, "released": 0}
    with engine.connect() as conn:
        assert [p.target for p in read_pauses(conn)] == [RELEASE]


def test_a_tenant_pause_holds_that_tenant_only(db_url):
    engine, kinds = engine_for(db_url), kinds_for(db_url)
    seed(engine, [1, 2])
    seed(engine, [3, 4], tenant="t2")
    run_pause(engine, RELEASE, "t2", reason="tenant migrating", actor="alice")

    result = batch(engine, kinds, [release_event(1), release_event(2), release_event(3, tenant="t2"),
                                   release_event(4, tenant="t2")])
    assert sorted(result.applied) == [key(RELEASE, 1), key(RELEASE, 2)]
    assert sorted(result.held) == [key(RELEASE, 3), key(RELEASE, 4)]
    assert statuses(engine) == {1: "released", 2: "released", 3: "held", 4: "held"}

    run_resume(engine, kinds, TOPOLOGY, RELEASE, "t2", reason="done", actor="alice", clock=clock)
    later = batch(engine, kinds, [release_event(3, tenant="t2"), release_event(4, tenant="t2")])
    assert sorted(later.applied) == [key(RELEASE, 3), key(RELEASE, 4)]
    assert applied_transitions(engine) == {key(RELEASE, i): 1 for i in (1, 2, 3, 4)}


def test_an_undeclared_kind_waits_held_and_resumes_once_declared_again(db_url):
    engine, kinds = engine_for(db_url), kinds_for(db_url)
    seed(engine, [1, 2])
    without = {name: kind for name, kind in kinds.items() if name != RELEASE}

    held = batch(engine, without, [release_event(1), release_event(2)])
    assert sorted(held.held) == [key(RELEASE, 1), key(RELEASE, 2)] and held.dead_lettered == []
    with engine.connect() as conn:
        reasons = conn.execute(select(ledger_transitions.c.reason).where(ledger_transitions.c.to_state == "held")
                               ).scalars().all()
    assert reasons and all(r.startswith("undeclared: kind 'release-reservation'") for r in reasons)
    assert release_parked_work(engine, without, TOPOLOGY, clock=clock).released == 0  # still undeclared

    assert release_parked_work(engine, kinds, TOPOLOGY, clock=clock).to_dict() == {
        "released": 2, "pages": 1, "by_kind": {RELEASE: 2}}
    done = batch(engine, kinds, [release_event(1), release_event(2)])
    assert sorted(done.applied) == [key(RELEASE, 1), key(RELEASE, 2)]
    assert set(ledger(engine).values()) == {("applied", 1)}


def test_a_budget_lets_through_at_most_its_count_then_pauses_its_kind_until_resumed(db_url):
    engine, kinds = engine_for(db_url), dict(kinds_for(db_url))
    kinds[RELEASE] = replace(kinds[RELEASE], budget=Budget(5, 3600.0))
    seed(engine, range(1, 11))

    first = batch(engine, kinds, [release_event(i) for i in range(1, 9)])
    assert len(first.applied) == 5 and len(first.held) == 3
    second = batch(engine, kinds, [release_event(i) for i in (9, 10)])
    assert second.applied == [] and sorted(second.held) == sorted([key(RELEASE, 9), key(RELEASE, 10)])
    assert list(statuses(engine).values()).count("released") == 5
    with engine.connect() as conn:
        (pause,) = read_pauses(conn)
        findings = [f for f in latest_findings(conn) if f.role == "budget"]
        used = conn.execute(select(func.sum(budget_usage.c.effects))).scalar_one()
    assert (pause.kind, pause.tenant, pause.cause, pause.actor) == (RELEASE, "", "budget", "budget")
    assert pause.details["max_effects"] == 5 and pause.reason == "budget of 5 per 1h spent"
    assert [f.subject for f in findings] == [RELEASE] and used == 5

    resumed = run_resume(engine, kinds, TOPOLOGY, RELEASE, None, reason="checked: legitimate backlog",
                         actor="alice", clock=clock)
    assert resumed["released"] == 5
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(budget_usage)).scalar_one() == 0  # a new window
    done = batch(engine, kinds, [release_event(i) for i in range(1, 11)])
    assert len(done.applied) == 5  # the five held ones, within the new window
    assert set(statuses(engine).values()) == {"released"}
    assert applied_transitions(engine) == {key(RELEASE, i): 1 for i in range(1, 11)}


def test_a_per_tenant_budget_pauses_only_the_tenant_that_spent_it(db_url):
    engine, kinds = engine_for(db_url), dict(kinds_for(db_url))
    kinds[RELEASE] = replace(kinds[RELEASE], budget=Budget(2, 3600.0, per_tenant=True))
    seed(engine, [1, 2, 3])
    seed(engine, [4], tenant="t2")
    result = batch(engine, kinds, [release_event(i) for i in (1, 2, 3)] + [release_event(4, tenant="t2")])
    assert sorted(result.applied) == [key(RELEASE, 1), key(RELEASE, 2), key(RELEASE, 4)]
    with engine.connect() as conn:
        assert [p.target for p in read_pauses(conn)] == [f"{RELEASE}/{TENANT}"]


def test_a_budget_holds_for_concurrent_workers_together(pg_url):
    """Three workers, each its own connection and batch of 20 due operations, at once: the budget
    of 25 is counted in the database, so exactly 25 are applied in all."""
    engine, kinds = engine_for(pg_url), dict(kinds_for(pg_url))
    kinds[RELEASE] = replace(kinds[RELEASE], budget=Budget(25, 3600.0))
    seed(engine, range(1, 61))
    start = threading.Barrier(3)
    results = {}

    def work(n: int) -> None:
        start.wait()
        results[n] = batch(engine, kinds, [release_event(i) for i in range(n * 20 + 1, n * 20 + 21)], f"w{n}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(len(r.applied) for r in results.values()) == 25
    assert sum(len(r.held) for r in results.values()) == 35
    assert list(statuses(engine).values()).count("released") == 25


def test_a_shadow_kind_records_what_it_would_do_and_live_then_applies_each_once(db_url):
    engine, kinds = engine_for(db_url), dict(kinds_for(db_url))
    shadow_kinds = {**kinds, RELEASE: replace(kinds[RELEASE], mode="shadow")}
    seed(engine, [1, 2])
    seed(engine, [3], status="paid")  # not eligible: live work would skip it
    events = [release_event(i) for i in (1, 2, 3)]

    shadowed = batch(engine, shadow_kinds, events)
    assert sorted(shadowed.shadowed) == [key(RELEASE, i) for i in (1, 2, 3)] and shadowed.applied == []
    assert statuses(engine) == {1: "held", 2: "held", 3: "paid"}  # nothing changed
    with engine.connect() as conn:
        records = {r.op_key: (r.outcome, r.would) for r in conn.execute(select(shadow_effects))}
        outcomes = [o.payload["status"] for o in conn.execute(
            select(outbox).where(outbox.c.topic == TOPOLOGY.outcomes))]
    assert records[key(RELEASE, 1)][0] == "apply"
    assert records[key(RELEASE, 1)][1]["set"]["status"] == ["held", "released"]
    assert records[key(RELEASE, 3)] == ("skip", {"skip": "the business row is no longer eligible"})
    assert outcomes == ["shadow"] * 3
    assert batch(engine, shadow_kinds, events).duplicates == 3  # redelivered: absorbed, recorded once

    assert release_parked_work(engine, shadow_kinds, TOPOLOGY, clock=clock).released == 0  # still shadow
    assert release_parked_work(engine, kinds, TOPOLOGY, clock=clock).released == 3  # switched to live
    live = batch(engine, kinds, events)
    assert sorted(live.applied) == [key(RELEASE, 1), key(RELEASE, 2)] and live.skipped == [key(RELEASE, 3)]
    assert statuses(engine) == {1: "released", 2: "released", 3: "paid"}
    assert applied_transitions(engine) == {key(RELEASE, 1): 1, key(RELEASE, 2): 1}


def test_a_pause_made_after_the_claim_holds_the_call_before_it_starts(pg_url):
    """An external effect claimed, then its kind paused before the call: the call is not made, the
    row is held with its attempt unchanged, and after the resume it is called once."""
    engine, kinds = engine_for(pg_url), kinds_for(pg_url)
    with engine.begin() as conn:
        conn.execute(insert(artifacts), [{"id": 1, "tenant": TENANT, "object_key": "exports/1.csv", "status": "live",
                                          "retain_until": NOW - timedelta(minutes=5)}])
    event = expiry_event(DELETE, 1, TENANT, NOW - timedelta(minutes=5), source="sweep", correlation_id="c1")
    calls: list[EffectCall] = []
    runner = EffectRunner(lambda kind: calls.append, concurrency=2)
    try:
        with engine.connect() as conn:
            sc = scope(conn, kinds)
            with conn.begin():
                claimed = apply_batch(sc, [event])
            assert [e.op_key for e in claimed.leased] == [key(DELETE, 1)]
            run_pause(engine, DELETE, None, reason="bucket migration", actor="alice")
            outcome = run_leased(runner, sc, claimed)
        assert calls == [] and outcome.held == [key(DELETE, 1)]
        assert ledger(engine, DELETE) == {key(DELETE, 1): ("held", 0)}

        run_resume(engine, kinds, TOPOLOGY, DELETE, None, reason="done", actor="alice", clock=clock)
        runner.watch = None  # a fresh read of the pauses, as the next batch would make
        with engine.connect() as conn:
            sc = scope(conn, kinds)
            with conn.begin():
                claimed = apply_batch(sc, [event])
            done = run_leased(runner, sc, claimed)
        assert [c.op_key for c in calls] == [key(DELETE, 1)] and done.applied == [key(DELETE, 1)]
        assert ledger(engine, DELETE) == {key(DELETE, 1): ("applied", 1)}
    finally:
        runner.close()


def test_held_work_is_neither_stuck_for_the_reconciler_nor_due_for_the_sweep(db_url):
    """The reconciler's stuck scans and the sweep's probe leave held rows alone: they wait for
    their release, they are not re-emitted in a loop."""
    engine, kinds = engine_for(db_url), kinds_for(db_url)
    seed(engine, [1])
    run_pause(engine, RELEASE, None, reason="looking", actor="alice")
    batch(engine, kinds, [release_event(1)])
    later = NOW + timedelta(days=1)
    with engine.begin() as conn:
        for state in ("pending", "claimed", "retry_scheduled"):
            assert mark_stuck(conn, state, later, None, 100, later) == []
        assert conn.execute(kinds[RELEASE].eligible_page(NOW, None, 100, without_ledger=True)).all() == []
    assert ledger(engine) == {key(RELEASE, 1): ("held", 0)}
