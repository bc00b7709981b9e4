"""`lapse show` on a real ledger, its outbox sent to a real broker by the relay: an operation
retried then applied, one dead-lettered then replayed, an unknown op key, the JSON shape, the
lookup by correlation id; and every statement it runs reads an index (EXPLAIN)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select

from lapse.devtools.demo_tables import artifacts
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import ExpiryEvent, Selection, expiry_event
from lapse.kernel.models import outbox
from lapse.operator_actions import replay
from lapse.processors import BatchScope, apply_batch
from lapse.processors.effects.object_stores import FilesystemObjectStore
from lapse.processors.failures import TEMPORARY, EffectFailure
from lapse.processors.leased import EffectRunner, run_leased
from lapse.readers.history_queries import (
    correlation_statement,
    created_with_statement,
    ledger_record,
    ledger_statement,
    outbox_statement,
    tenant_page_statement,
    transitions_statement,
)
from lapse.shell.app import main
from tests.fixtures.kinds import demo_kinds
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.readers import relay

# The fake clock: minutes ago, so the default correlation window (the last day) holds it.
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
LEASE = timedelta(seconds=30)


@pytest.fixture
def env(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique)
    engine = make_engine(pg_url)
    yield settings, engine
    engine.dispose()


def scope(conn, settings, worker, now, positions=None) -> BatchScope:
    return BatchScope(conn, kinds=demo_kinds(conn.engine), topics=settings.topology, worker=worker, now=now,
                      lease=LEASE, positions=positions or {}, rng=random.Random(1))


class FailingOnce:
    """An object store whose first delete fails with a temporary error, then deletes."""

    def __init__(self, inner: FilesystemObjectStore) -> None:
        self.inner, self.failed = inner, False

    def delete(self, key: str) -> bool:
        if not self.failed:
            self.failed = True
            raise EffectFailure(TEMPORARY, "503 Service Unavailable")
        return self.inner.delete(key)


def deliver(engine, settings, events, store, now, positions=None) -> None:
    """One delivery as the worker makes it: claim, run the leased effects, complete; `positions`
    says where each op key's event was read."""
    runner = EffectRunner(lambda kind: lambda call: store.delete(call.target["object_key"]), concurrency=1)
    try:
        with engine.connect() as conn:
            batch = scope(conn, settings, "w1", now, positions)
            with conn.begin():
                first = apply_batch(batch, events)
            run_leased(runner, batch, first, lambda: now)
    finally:
        runner.close()


def event_of(payload: dict) -> ExpiryEvent:
    return expiry_event(payload["kind"], payload["subject_id"], payload["tenant"],
                        datetime.fromtimestamp(payload["due_at"] / 1000, UTC), source=payload["source"],
                        correlation_id=payload["correlation_id"], attempt=payload["attempt"],
                        replay_id=payload.get("replay_id"))


def outbox_payloads(engine, topic: str, key: str) -> list[dict]:
    with engine.connect() as conn:
        return list(conn.execute(select(outbox.c.payload).where(outbox.c.topic == topic, outbox.c.key == key)
                                 .order_by(outbox.c.id)).scalars())


def artifact_due(engine, tmp_path, name: str, correlation_id: str) -> tuple[FilesystemObjectStore, ExpiryEvent]:
    """A live artifact `name` past its retention, its object in a store of `tmp_path`, and its event."""
    store = FilesystemObjectStore(tmp_path / "objects")
    store.put(f"exports/{name}.csv", b"x")
    with engine.begin() as conn:
        aid = conn.execute(insert(artifacts).values(
            tenant="t1", object_key=f"exports/{name}.csv", status="live", retain_until=T0 - timedelta(hours=1),
        ).returning(artifacts.c.id)).scalar()
    return store, expiry_event("artifact-delete", aid, "t1", T0 - timedelta(hours=1), source="sweep",
                               correlation_id=correlation_id)


def retried_then_applied(engine, settings, tmp_path) -> str:
    """An artifact delete that fails once (temporary), waits in a delay tier, then is applied."""
    store, event = artifact_due(engine, tmp_path, "a", "corr-retried")
    flaky = FailingOnce(store)
    deliver(engine, settings, [event], flaky, T0)
    (wake,) = [p for tier in settings.topology.delay_topics for p in outbox_payloads(engine, tier, event.op_key)]
    deliver(engine, settings, [event_of(wake)], flaky, datetime.fromtimestamp(wake["due_at"] / 1000, UTC))
    return event.op_key


def dead_lettered_then_replayed(engine, settings) -> tuple[str, str]:
    """A release with a non-numeric subject: dead-lettered (invalid), replayed by an operator,
    dead-lettered again. Returns (op key, replay id)."""
    event = expiry_event("release-reservation", "x1", "t1", T0 - timedelta(minutes=1), source="sweep",
                         correlation_id="corr-dead")
    with engine.begin() as conn:
        apply_batch(scope(conn, settings, "w1", T0), [event])
    with engine.begin() as conn:
        replay_id, released = replay(conn, Selection(op_keys=(event.op_key,)), limit=1, reason="fixed parser",
                                     actor="alice", now=T0 + timedelta(minutes=1),
                                     expiry_topic=settings.topology.expiry)
    assert [r["op_key"] for r in released] == [event.op_key]
    (again,) = outbox_payloads(engine, settings.topology.expiry, event.op_key)
    with engine.begin() as conn:
        apply_batch(scope(conn, settings, "w1", T0 + timedelta(minutes=2)), [event_of(again)])
    return event.op_key, replay_id


def show(settings, *args: str):
    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    return CliRunner().invoke(main, ["show", *args], env=env)


def test_show_an_operation_retried_then_applied(env, tmp_path):
    settings, engine = env
    op_key = retried_then_applied(engine, settings, tmp_path)
    assert relay(settings) > 0  # the outbox goes to the broker: every record gets its sent time

    result = show(settings, op_key, "--json")
    assert result.exit_code == 0, result.output
    h = json.loads(result.stdout)
    assert set(h) == {"op_key", "ledger", "transitions", "outbox", "replay_ids", "dead_letter"}
    assert (h["op_key"], h["ledger"]["state"], h["ledger"]["attempt"]) == (op_key, "applied", 2)
    assert h["ledger"]["created_at"] == T0.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert [(t["from_state"], t["to_state"], t["attempt"], t["failure_class"], t["reason"])
            for t in h["transitions"]] == [
        ("pending", "claimed", 0, None, None),
        ("claimed", "retry_scheduled", 1, TEMPORARY, "503 Service Unavailable"),
        ("retry_scheduled", "claimed", 1, None, None),
        ("claimed", "applied", 2, None, None)]
    outcomes = [o for o in h["outbox"] if o["role"] == "outcomes"]
    assert [(o["record"]["status"], o["record"]["failure_class"]) for o in outcomes] == [
        ("retry_scheduled", TEMPORARY), ("applied", None)]
    assert [o["role"] for o in h["outbox"]].count("outcomes") == 2
    assert any(o["role"].startswith("delay ") and o["schema"] == "expiry_event" for o in h["outbox"])
    assert all(o["sent_at"] is not None and o["sent_at"].endswith("Z") for o in h["outbox"])
    assert (h["replay_ids"], h["dead_letter"]) == ([], None)

    text = show(settings, op_key)
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"{op_key}  applied  attempt 2")
    assert any("claimed -> retry_scheduled  attempt 1  by w1  FAILED temporary: 503 Service Unavailable" in line
               for line in lines)
    applied = [line for line in lines if "outcome applied attempt 2" in line]
    assert len(applied) == 1 and "; sent 20" in applied[0] and "[outcomes]" in applied[0]


def test_show_a_dead_letter_replayed_and_dead_again(env):
    settings, engine = env
    op_key, replay_id = dead_lettered_then_replayed(engine, settings)

    h = json.loads(show(settings, op_key, "--json").stdout)
    assert (h["ledger"]["state"], h["ledger"]["replay_id"], h["replay_ids"]) == ("dead_letter", replay_id, [replay_id])
    assert [(t["from_state"], t["to_state"], t["failure_class"], t["replay_id"]) for t in h["transitions"]] == [
        ("pending", "dead_letter", "invalid", None),
        ("dead_letter", "pending", None, replay_id),
        ("pending", "dead_letter", "invalid", replay_id)]
    replayed = next(t for t in h["transitions"] if t["from_state"] == "dead_letter")
    assert (replayed["actor"], replayed["reason"]) == ("alice", "fixed parser")
    dead = h["dead_letter"]
    assert dead["failure_class"] == "invalid" and len(dead["history"]) == 2
    assert [d["replay_id"] for d in dead["history"]] == [None, replay_id]
    assert all(d["reason"] for d in dead["history"])
    dlq = [o for o in h["outbox"] if o["role"] == "dlq"]
    assert len(dlq) == 2 and [o["sent_at"] for o in dlq] == [None, None]  # no relay ran: not sent yet
    assert len(dlq[-1]["record"]["history"]) == 2

    text = show(settings, op_key).stdout
    assert f"replay {replay_id}" in text and "DEAD LETTER since" in text and "not sent yet" in text
    assert "FAILED invalid: " in text and "(fixed parser)" in text


def test_an_unknown_op_key_is_one_line_and_exit_1(env):
    settings, _ = env
    result = show(settings, "release-reservation:404")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["lapse: no operation release-reservation:404 in the ledger"]
    malformed = show(settings, "not an op key")
    assert malformed.exit_code == 2 and len(malformed.output.strip().splitlines()) == 1
    neither = show(settings)
    assert neither.exit_code == 2 and "exactly one of OP_KEY, --subject KIND ID, --correlation-id" in neither.output


def test_correlation_id_finds_its_operations(env, tmp_path):
    settings, engine = env
    op_key = retried_then_applied(engine, settings, tmp_path)
    dead_key, _ = dead_lettered_then_replayed(engine, settings)

    result = show(settings, "--correlation-id", "corr-retried", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert set(found) == {"correlation_id", "since", "until", "more", "operations"}
    assert [h["op_key"] for h in found["operations"]] == [op_key] and found["more"] is False
    assert found["operations"][0] == json.loads(show(settings, op_key, "--json").stdout)

    text = show(settings, "--correlation-id", "corr-dead")
    assert text.exit_code == 0 and text.stdout.startswith(f"{dead_key}  dead_letter")

    since, until = T0 + timedelta(minutes=10), T0 + timedelta(minutes=20)  # after its transitions
    missed = show(settings, "--correlation-id", "corr-dead", "--since", since.isoformat(), "--until",
                  until.isoformat())
    assert missed.exit_code == 1
    assert missed.output.strip().splitlines() == [
        "lapse: no operation with correlation id corr-dead in transitions from "
        f"{since.isoformat(timespec='milliseconds')[:-6]}Z to {until.isoformat(timespec='milliseconds')[:-6]}Z"]
    backwards = show(settings, "--correlation-id", "corr-dead", "--since", until.isoformat(), "--until",
                     since.isoformat())
    assert backwards.exit_code == 2 and "is not before --until" in backwards.output
    assert show(settings, "--correlation-id", "nobody").exit_code == 1


def test_each_transition_names_the_event_behind_it_and_a_later_correlation_id_is_found(env, tmp_path):
    """A delivery read at expiry[3]@41 fails once; its wake-up, read at tier[0]@7, carries another
    correlation id (a producer's redelivery would): each transition names its event's position, and
    the later id finds the operation through its transitions, the first through the ledger."""
    settings, engine = env
    store, event = artifact_due(engine, tmp_path, "b", "corr-first")
    flaky, expiry = FailingOnce(store), settings.topology.expiry
    deliver(engine, settings, [event], flaky, T0, {event.op_key: (expiry, 3, 41)})
    (tier, wake), = [(t, p) for t in settings.topology.delay_topics for p in outbox_payloads(engine, t, event.op_key)]
    later = event_of({**wake, "correlation_id": "corr-later"})
    deliver(engine, settings, [later], flaky, datetime.fromtimestamp(wake["due_at"] / 1000, UTC),
            {event.op_key: (tier, 0, 7)})

    shown = json.loads(show(settings, event.op_key, "--json").stdout)
    assert shown["ledger"]["state"] == "applied"
    read_at = [(t["to_state"], t["event_topic"], t["event_partition"], t["event_offset"])
               for t in shown["transitions"]]
    assert read_at[-1] == ("applied", tier, 0, 7)
    assert ("retry_scheduled", expiry, 3, 41) in read_at
    assert f"event {expiry}[3]@41" in show(settings, event.op_key).stdout
    for correlation_id in ("corr-first", "corr-later"):
        found = json.loads(show(settings, "--correlation-id", correlation_id, "--json").stdout)
        assert [h["op_key"] for h in found["operations"]] == [event.op_key], correlation_id


def plan(conn, stmt) -> str:
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    return "\n".join(conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.params).scalars())


def test_every_statement_reads_an_index(env, tmp_path):
    """With sequential scans priced out (a test's tables are small), each statement's plan walks
    indexes only: none needs a scan of the ledger, the transitions or the outbox."""
    settings, engine = env
    op_key = retried_then_applied(engine, settings, tmp_path)
    with engine.begin() as conn:
        row = ledger_record(conn, op_key)
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plans = {
            "ledger": plan(conn, ledger_statement(op_key)),
            "transitions": plan(conn, transitions_statement(row)),
            "outbox": plan(conn, outbox_statement(row)),
            "correlation": plan(conn, correlation_statement("corr-retried", T0, T0 + timedelta(hours=1), 21)),
            "created with": plan(conn, created_with_statement("corr-retried", T0, T0 + timedelta(hours=1), 21)),
            "tenant page": plan(conn, tenant_page_statement("t1", None, ("artifact-delete", op_key), 51)),
            "tenant kind page": plan(conn, tenant_page_statement("t1", "artifact-delete", None, 51)),
        }
    for name, text in plans.items():
        assert "Seq Scan" not in text, f"{name}:\n{text}"
    assert "pk_lapse_ledger" in plans["ledger"]
    assert "ix_lapse_transitions_failures" in plans["transitions"]
    assert "ix_lapse_transitions_at" in plans["transitions"]
    assert "ix_lapse_outbox_unsent" in plans["outbox"] and "ix_lapse_outbox_sent" in plans["outbox"]
    assert "ix_lapse_transitions_at" in plans["correlation"]
    assert "ix_lapse_ledger_correlation" in plans["created with"]
    assert "ix_lapse_ledger_tenant" in plans["tenant page"] and "Sort" not in plans["tenant page"]
    assert "ix_lapse_ledger_tenant" in plans["tenant kind page"] and "Sort" not in plans["tenant kind page"]


def test_an_operation_is_found_by_its_business_row_and_a_tenant_s_are_listed_a_page_at_a_time(env, tmp_path):
    settings, engine = env
    applied = retried_then_applied(engine, settings, tmp_path)
    dead, _ = dead_lettered_then_replayed(engine, settings)
    others = [expiry_event("release-reservation", 900 + i, "t2" if i % 2 else "t1", T0, source="sweep")
              for i in range(5)]
    with engine.begin() as conn:
        apply_batch(scope(conn, settings, "w1", T0), others)

    by_subject = show(settings, "--subject", *applied.split(":"), "--json")
    assert by_subject.exit_code == 0, by_subject.output
    assert json.loads(by_subject.output) == json.loads(show(settings, applied, "--json").output)

    t1 = sorted([applied, dead] + [e.op_key for e in others if e.tenant == "t1"])
    pages, after = [], []
    while True:
        page = json.loads(show(settings, "--tenant", "t1", "--limit", "2", "--json", *after).output)
        pages.append([o["op_key"] for o in page["operations"]])
        if page["next"] is None:
            break
        after = ["--after", page["next"]]
    assert [key for keys in pages for key in keys] == t1 and [len(keys) for keys in pages] == [2, 2, 1]
    releases = json.loads(show(settings, "--tenant", "t1", "--kind", "release-reservation", "--json").output)
    assert [o["op_key"] for o in releases["operations"]] == [k for k in t1 if k.startswith("release-")]
    assert {o["state"] for o in releases["operations"] if o["op_key"] == dead} == {"dead_letter"}
    text = show(settings, "--tenant", "t2", "--limit", "1").output.splitlines()
    assert text[0] == "tenant t2: 1 operation(s) on this page" and text[-1].startswith("more: add --after ")

    for args, line in [
            (["--tenant", "nobody"], "lapse: unknown tenant 'nobody': no operation has it"),
            (["--tenant", "t1", "--kind", "release-reservatoin"],
             "lapse: unknown kind 'release-reservatoin': no operation has it and no declaration names it; did you "
             "mean 'release-reservation'?"),
            (["--subject", "expire-order", "1"], "lapse: unknown kind 'expire-order': no operation has it and no "
                                                 "declaration names it; the kinds file declares artifact-delete, "
                                                 "release-reservation"),
            (["--subject", "release-reservation", "404"], "lapse: no operation release-reservation:404 in the ledger")]:
        result = show(settings, *args)
        assert (result.exit_code, result.output.splitlines()) == (1 if "404" in args else 2, [line]), args
