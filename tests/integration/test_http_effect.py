"""The declared `http` effect against a real HTTP server the test starts, on a real database.

The server answers per subject: 200; 429 with Retry-After, then 200; 503, then 200; 400; a hang
past the timeout, then 200. A fake clock drives the attempts until every ledger row is terminal;
the ledger, the outbox, the business rows and what the server received show the failure classes.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from sqlalchemy import select

from lapse.kernel.kinds import CleanupKind, compile_kinds, read_kinds_file
from lapse.kernel.kinds.limits import Limits
from lapse.kernel.ledger import TERMINAL, ExpiryEvent, expiry_event
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.processors.effect_calls import build_caller
from lapse.processors.leased import EffectRunner, run_leased
from lapse.processors.rules import apply_batch
from lapse.processors.scope import BatchScope
from tests.fixtures.effects import Answer, hooks_table
from tests.fixtures.topology import repo_topology

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TOPOLOGY = repo_topology()
TOKEN = "s3cr3t-t0ken"
KIND = "notify-hook"

hooks = hooks_table("hooks")


def hook_kind(engine, tmp_path, url: str, *, idempotent: bool = True) -> CleanupKind:
    """`notify-hook` declared in a kinds file and compiled against the table: POST per open hook
    past its due time, then `status: notified`. `idempotent=False` is what a kind whose far side
    ignores the idempotency key would say (a Python kind)."""
    declaration = {"kinds": {KIND: {
        "table": "public.hooks", "id": "id", "tenant": "tenant", "due": "due_at",
        "eligible": {"status": "open"},
        "effect": {"http": {"method": "POST", "url": url, "headers": {"Authorization": f"Bearer {TOKEN}"},
                            "timeout_s": 1.5, "then_set": {"status": "notified", "notified_at": "now"}}},
        "retry": {"max_attempts": 3, "base_s": 1.0, "cap_s": 10.0},
    }}}
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump(declaration))
    kind = compile_kinds(read_kinds_file(path), engine)[KIND]
    return kind if idempotent else replace(kind, idempotent_effect=False)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def add_hooks(engine, scripts: list[str]) -> list[ExpiryEvent]:
    """The table (with its due index), one open hook per script (ids 1..n, tenant t1, due an hour
    ago) and its sweep event."""
    hooks.create(engine)
    with engine.begin() as conn:
        conn.execute(hooks.insert(), [{"id": i, "tenant": "t1", "script": s, "status": "open",
                                       "due_at": T0 - timedelta(hours=1)} for i, s in enumerate(scripts, 1)])
    return [expiry_event(KIND, i, "t1", T0 - timedelta(hours=1), source="sweep", correlation_id=f"c{i}")
            for i in range(1, len(scripts) + 1)]


def ledger(engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r["op_key"]: r for r in conn.execute(select(cleanup_ledger)).mappings()}


def run_until_terminal(engine, kind: CleanupKind, events: list[ExpiryEvent], rounds: int = 5) -> None:
    """Deliver the events as a worker does (claim, call under the lease, complete), then each
    retry when due on the fake clock, until every ledger row is terminal."""
    clock = Clock(T0)
    runner = EffectRunner(build_caller, concurrency=4)
    try:
        for _ in range(rounds):
            with engine.connect() as conn:
                scope = BatchScope(conn, kinds={kind.name: kind}, topics=TOPOLOGY, worker="w1",
                                   now=clock(), lease=LEASE, rng=random.Random(1))
                with conn.begin():
                    claimed = apply_batch(scope, events)
                run_leased(runner, scope, claimed, clock)
            waiting = [r for r in ledger(engine).values() if r["state"] not in TERMINAL]
            if not waiting:
                return
            clock.now = max(r["due_at"] for r in waiting) + timedelta(seconds=1)
            by_key = {e.op_key: e for e in events}
            events = [by_key[r["op_key"]]._replace(due_at=r["due_at"], attempt=r["attempt"]) for r in waiting]
    finally:
        runner.close()
    raise AssertionError(f"not terminal after {rounds} rounds: {[r['op_key'] for r in waiting]}")


def transitions(engine, op_key: str) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(ledger_transitions.c.to_state, ledger_transitions.c.failure_class)
            .where(ledger_transitions.c.op_key == op_key).order_by(ledger_transitions.c.id))]


def outbox_rows(engine, topic: str) -> list[Any]:
    with engine.connect() as conn:
        return [r for r in conn.execute(select(outbox).where(outbox.c.topic == topic).order_by(outbox.c.id))
                .mappings()]


def business(engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(hooks.c.id, hooks.c.status)).all())


def test_http_effect_outcomes_follow_the_failure_classes(engine, http_server, tmp_path):
    http_server.script("ok", Answer(200))
    http_server.script("limited", Answer(429, {"Retry-After": "7"}), Answer(204))
    http_server.script("flaky", Answer(503, body=b"upstream down\n" * 200), Answer(200))
    http_server.script("bad", Answer(400, body=b'{"error": "unknown hook"}'))
    http_server.script("hang", Answer(hang=True), Answer(200))
    scripts = ["ok", "limited", "flaky", "bad", "hang"]
    events = add_hooks(engine, scripts)
    key = {s: e.op_key for s, e in zip(scripts, events, strict=True)}
    kind = hook_kind(engine, tmp_path, http_server.url + "/hooks/{script}/{subject_id}?tenant={tenant}")

    run_until_terminal(engine, kind, events)

    rows = ledger(engine)
    assert {s: (rows[key[s]]["state"], rows[key[s]]["attempt"], rows[key[s]]["last_failure_class"])
            for s in scripts} == {
        "ok": ("applied", 1, None),
        "limited": ("applied", 1, "rate_limited"),  # a 429 burns no attempt
        "flaky": ("applied", 2, "temporary"),
        "bad": ("dead_letter", 1, "invalid"),
        "hang": ("applied", 2, "ambiguous"),  # idempotent: retried with the same key
    }
    assert transitions(engine, key["limited"])[1:] == [("retry_scheduled", "rate_limited"), ("claimed", None),
                                                       ("applied", None)]
    assert transitions(engine, key["bad"])[-1] == ("dead_letter", "invalid")
    assert rows[key["bad"]]["last_failure"].startswith("HTTP 400 Bad Request from POST 127.0.0.1:")
    assert "unknown hook" in rows[key["bad"]]["last_failure"]
    assert len(rows[key["flaky"]]["last_failure"] or "") < 300  # one short line, not the body
    assert "ReadTimeout" in rows[key["hang"]]["last_failure"]
    # The 429's Retry-After is the retry's due time, exactly.
    wake = [r for t in TOPOLOGY.delay_topics for r in outbox_rows(engine, t) if r["key"] == key["limited"]]
    assert [w["headers"]["lapse-due-at"] for w in wake] == [str(int((T0 + timedelta(seconds=7)).timestamp() * 1000))]

    outcomes = {}
    for r in outbox_rows(engine, TOPOLOGY.outcomes):
        outcomes.setdefault(r["key"], []).append(r["payload"]["status"])
    assert outcomes == {key["ok"]: ["applied"], key["limited"]: ["retry_scheduled", "applied"],
                        key["flaky"]: ["retry_scheduled", "applied"], key["bad"]: ["dead_letter"],
                        key["hang"]: ["retry_scheduled", "applied"]}
    (dlq,) = outbox_rows(engine, TOPOLOGY.dlq)
    assert dlq["key"] == key["bad"]

    assert business(engine) == {1: "notified", 2: "notified", 3: "notified", 4: "open", 5: "notified"}

    # The server saw the op key as the idempotency key on every attempt, the attempt counting up
    # (a rate-limited try is not an attempt), the declared header, and the body naming the work.
    seen = {s: http_server.requests_for(key[s]) for s in scripts}
    assert {s: [r.headers["lapse-attempt"] for r in reqs] for s, reqs in seen.items()} == {
        "ok": ["1"], "limited": ["1", "1"], "flaky": ["1", "2"], "bad": ["1"], "hang": ["1", "2"]}
    assert len(http_server.received) == sum(len(reqs) for reqs in seen.values())
    first = seen["flaky"][1]
    assert (first.method, first.path) == ("POST", "/hooks/flaky/3?tenant=t1")
    assert first.headers["authorization"] == f"Bearer {TOKEN}"
    assert first.body == {"op_key": key["flaky"], "kind": KIND, "subject_id": "3", "tenant": "t1", "attempt": 2}
    # No reason anywhere repeats a header value.
    with engine.connect() as conn:
        reasons = list(conn.execute(select(ledger_transitions.c.reason)).scalars())
    assert not any(TOKEN in (r or "") for r in reasons)


def test_a_timeout_on_an_effect_that_is_not_idempotent_is_dead_lettered_for_a_person(
        engine, http_server, tmp_path):
    http_server.script("hang", Answer(hang=True), Answer(200))
    (event,) = add_hooks(engine, ["hang"])
    kind = hook_kind(engine, tmp_path, http_server.url + "/hooks/{script}/{subject_id}", idempotent=False)

    run_until_terminal(engine, kind, [event])

    row = ledger(engine)[event.op_key]
    assert (row["state"], row["attempt"], row["last_failure_class"]) == ("dead_letter", 1, "ambiguous")
    assert "a person must check" in row["last_failure"]
    assert business(engine) == {1: "open"}
    assert [r.headers["lapse-attempt"] for r in http_server.requests_for(event.op_key)] == ["1"]


def add_hook_of(engine, tenant: str) -> ExpiryEvent:
    """The table, one open hook of `tenant` (id 1, script ok, due an hour ago) and its sweep event."""
    hooks.create(engine)
    with engine.begin() as conn:
        conn.execute(hooks.insert(), [{"id": 1, "tenant": tenant, "script": "ok", "status": "open",
                                       "due_at": T0 - timedelta(hours=1)}])
    return expiry_event(KIND, 1, tenant, T0 - timedelta(hours=1), source="sweep", correlation_id="c1")


def test_url_placeholders_are_url_encoded(engine, http_server, tmp_path):
    """A placeholder value is URL-encoded: a tenant `a/b c?` cannot add a path segment or a query."""
    http_server.script("ok", Answer(200))
    event = add_hook_of(engine, "a/b c?")
    kind = hook_kind(engine, tmp_path, http_server.url + "/hooks/{script}/{tenant}")

    run_until_terminal(engine, kind, [event])

    assert ledger(engine)[event.op_key]["state"] == "applied"
    assert [r.path for r in http_server.received] == ["/hooks/ok/a%2Fb%20c%3F"]


def test_a_value_that_would_climb_a_path_segment_is_dead_lettered_and_nothing_is_sent(engine, http_server, tmp_path):
    """A tenant `..` in `/hooks/{script}/{tenant}/release` would make the request `/hooks/release`
    (clients and servers remove dot segments), the static Authorization header included: refused."""
    http_server.script("ok", Answer(200))
    event = add_hook_of(engine, "..")
    kind = hook_kind(engine, tmp_path, http_server.url + "/hooks/{script}/{tenant}/release")

    run_until_terminal(engine, kind, [event])

    row = ledger(engine)[event.op_key]
    assert (row["state"], row["last_failure_class"]) == ("dead_letter", "invalid")
    assert "URL placeholder {tenant} makes the path segment '..'" in row["last_failure"]
    assert http_server.received == []
    assert business(engine) == {1: "open"}


def test_a_429_without_retry_after_on_every_call_backs_off_exponentially_to_the_cap_then_dead_letters(
        engine, http_server, tmp_path):
    """The far side answers 429 without Retry-After, for ever. No attempt is burnt; each wait is in
    the upper half of min(cap, base * 2**n), n the rate-limited tries before it, so the waits double
    up to the cap; past the kind's deadline the operation is dead-lettered, class rate_limited."""
    http_server.script("busy", Answer(429))
    (event,) = add_hooks(engine, ["busy"])
    kind = replace(hook_kind(engine, tmp_path, http_server.url + "/hooks/{script}/{subject_id}"),
                   retry_base_s=1.0, retry_cap_s=8.0, rate_limited_for_s=60.0, limits=Limits(10_000.0))

    run_until_terminal(engine, kind, [event], rounds=40)

    row = ledger(engine)[event.op_key]
    assert (row["state"], row["attempt"], row["last_failure_class"]) == ("dead_letter", 0, "rate_limited")
    assert row["last_failure"].startswith(f"rate limited {len(http_server.received)} times since ")
    # Each delivery came one second after the last wake-up's due time (run_until_terminal's clock).
    due = [datetime.fromtimestamp(int(w["headers"]["lapse-due-at"]) / 1000, UTC)
           for t in TOPOLOGY.delay_topics for w in outbox_rows(engine, t)]
    due.sort()
    delivered = [T0, *(d + timedelta(seconds=1) for d in due)]
    waits = [(d - at).total_seconds() for d, at in zip(due, delivered, strict=False)]
    nominal = [min(8.0, 2.0 ** n) for n in range(len(waits))]
    assert all(n / 2 - 0.001 <= w <= n for w, n in zip(waits, nominal, strict=True)), waits
    assert nominal[:5] == [1, 2, 4, 8, 8] and len(waits) >= 8
    assert delivered[len(waits)] >= T0 + timedelta(seconds=60) > delivered[len(waits) - 1]
    assert len(http_server.received) == len(waits) + 1
