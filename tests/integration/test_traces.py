"""Traces on the real pipeline (docs/design/traces.md): Apache Kafka, PostgreSQL, a real HTTP far
side, and the processor, delay worker and relay at work, with spans recorded in memory.

Three hooks: one scheduled under the application's trace context, answered 429, then 503, then
200 (two retries through a delay tier); one scheduled without a context, answered 400 (a dead
letter), then replayed by an operator and answered 200; two found by the sweep. Each operation is
one trace from its publish (or sweep page) to its last outcome record: every stage's span, every
request the far side received, every outcome and dead-letter record carries it. And a role process
sends its spans over OTLP/HTTP when `tracing.endpoint` is set."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta

import pytest
import yaml
from opentelemetry.trace import StatusCode
from sqlalchemy import select

from lapse.kernel.clock import database_now
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.kinds import load_kinds
from lapse.kernel.ledger import Selection
from lapse.kernel.models import cleanup_ledger, outbox
from lapse.kernel.settings import REPO_ROOT
from lapse.kernel.trace_context import TRACEPARENT, trace_id_of, traceparent_in
from lapse.kernel.tracing import EFFECT, PROCESS, PUBLISH, RELAY, SWEEP
from lapse.operator_actions import replay
from lapse.processors.delay_worker import DelayWorker
from lapse.producers import run_relay, schedule_cleanup, sweep_once
from tests.fixtures.effects import Answer, hook_kind, hooks_table
from tests.fixtures.kafka import read_topic
from tests.fixtures.polling import eventually
from tests.fixtures.processes import role_env, run_lapse
from tests.fixtures.spans import span_id_of, trace_of
from tests.fixtures.workers import running_workers

KIND = "trace-hook"
# The application's own trace context around its schedule_cleanup call.
APP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
hooks = hooks_table("trace_hooks")


def _state(engine, op_key: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(cleanup_ledger.c.state).where(cleanup_ledger.c.op_key == op_key)).scalar()


def _all_sent(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(outbox.c.id).where(outbox.c.sent_at.is_(None)).limit(1)).first() is None


def _by_op_key(records) -> dict[str, list]:
    out = defaultdict(list)
    for msg in sorted(records, key=lambda m: m.timestamp()[1]):
        out[msg.key().decode()].append(msg)
    return out


@pytest.mark.slow  # about 10 s: two retries through a delay tier and a replay
def test_one_trace_from_schedule_to_outcome_across_a_retry_and_a_replay(pipeline, http_server, tmp_path,
                                                                         recorded_spans):
    http_server.script("retried", Answer(429, {"Retry-After": "1"}), Answer(503), Answer(200))
    http_server.script("replayed", Answer(400), Answer(200))
    http_server.script("swept", Answer(200))
    path = tmp_path / "kinds.yaml"
    path.write_text(yaml.safe_dump({"kinds": {KIND: hook_kind(hooks, http_server.url)}}))
    settings = pipeline.settings.with_(kinds={"file": str(path)})
    engine, codec = pipeline.engine, Codec.from_settings(settings)
    hooks.create(engine)
    with engine.begin() as conn:
        due = database_now(conn) - timedelta(minutes=1)
        conn.execute(hooks.insert(), [{"id": i, "tenant": "t1", "script": script, "status": "open", "due_at": due}
                                      for i, script in enumerate(["retried", "replayed", "swept", "swept"], 1)])
        schedule_cleanup(conn, KIND, 1, "t1", due, settings=settings, traceparent=APP)
        schedule_cleanup(conn, KIND, 2, "t1", due, settings=settings, traceparent="00-forged-by-a-caller")
    retried, replayed, swept = f"{KIND}:1", f"{KIND}:2", [f"{KIND}:3", f"{KIND}:4"]
    sweep_once(engine, make_producer(settings), codec, settings, load_kinds(settings, engine))

    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(engine, make_producer(settings), codec),
                             kwargs={"limit": 100, "idle_s": 0.05, "stop": stop}, name="relay")
    delay = DelayWorker(settings, stop=stop)
    forwarding = threading.Thread(target=delay.run, name="delay")
    relay.start()
    forwarding.start()
    try:
        with running_workers(settings) as workers:
            def settled() -> bool:
                workers.check()
                return (_state(engine, retried), _state(engine, replayed)) == ("applied", "dead_letter") and all(
                    _state(engine, key) == "applied" for key in swept)

            eventually(settled, timeout_s=60, interval_s=0.2, what="the retried hook applied, the other dead")
            with engine.begin() as conn:
                replay(conn, Selection(op_keys=(replayed,)), limit=1, reason="the far side knows it now",
                       actor="tester", now=database_now(conn), expiry_topic=settings.topology.expiry)
            eventually(lambda: (workers.check(), _state(engine, replayed) == "applied")[1], timeout_s=30,
                       interval_s=0.2, what="the replayed hook applied")
            eventually(lambda: _all_sent(engine), timeout_s=30, interval_s=0.1, what="every outcome relayed")
    finally:
        stop.set()
        relay.join(30)
        forwarding.join(30)

    spans = recorded_spans.get_finished_spans()
    publish = {s.attributes["lapse.op_key"]: s for s in spans if s.name == PUBLISH}
    assert set(publish) == {retried, replayed}
    # The application's context is the publish span's parent; a forged one was dropped (a new trace).
    assert trace_of(publish[retried]) == trace_id_of(APP) and publish[retried].parent.span_id == int(APP[36:52], 16)
    assert publish[replayed].parent is None
    sweeps = [s for s in spans if s.name == SWEEP]
    assert len(sweeps) == 1
    traces = {retried: trace_id_of(APP), replayed: trace_of(publish[replayed]), **dict.fromkeys(swept,
                                                                                               trace_of(sweeps[0]))}
    in_trace = defaultdict(list)
    for s in spans:
        in_trace[trace_of(s)].append(s)
    names = {key: sorted(s.name for s in in_trace[trace]) for key, trace in traces.items()}
    # retried: three batch steps, three calls, and the relay of its wake-ups and outcomes.
    assert names[retried].count(PROCESS) == 3 and names[retried].count(EFFECT) == 3 and RELAY in names[retried]
    # replayed: its first batch step and call, then the replay's.
    assert names[replayed].count(PROCESS) == 2 and names[replayed].count(EFFECT) == 2 and RELAY in names[replayed]
    assert {SWEEP, PROCESS, EFFECT, RELAY} <= set(names[swept[0]])
    calls = {key: [s for s in in_trace[trace] if s.name == EFFECT and s.attributes["lapse.op_key"] == key]
             for key, trace in traces.items()}
    assert [s.status.status_code for s in sorted(calls[retried], key=lambda s: s.start_time)] == [
        StatusCode.ERROR, StatusCode.ERROR, StatusCode.UNSET]

    # Every request carried its operation's trace, its parent the span of that very call.
    for key, trace in traces.items():
        sent = [traceparent_in(r.headers.items()) for r in http_server.requests_for(key)]
        assert sent and all(tp is not None and trace_id_of(tp) == trace for tp in sent), (key, sent)
        assert {tp[36:52] for tp in sent} == {span_id_of(s) for s in calls[key]}

    # Every outcome and dead-letter record carries it; the dead letter's row kept it for the replay.
    outcomes = _by_op_key(read_topic(settings.kafka.bootstrap_servers, settings.topology.outcomes))
    for key, trace in traces.items():
        carried = [traceparent_in(m.headers()) for m in outcomes[key]]
        assert carried and all(tp is not None and trace_id_of(tp) == trace for tp in carried), (key, carried)
    assert len(outcomes[retried]) == 3 and len(outcomes[replayed]) == 2
    dead = _by_op_key(read_topic(settings.kafka.bootstrap_servers, settings.topology.dlq))
    assert list(dead) == [replayed]
    assert trace_id_of(traceparent_in(dead[replayed][0].headers())) == traces[replayed]
    with engine.connect() as conn:
        kept = conn.execute(select(cleanup_ledger.c.traceparent).where(cleanup_ledger.c.op_key == replayed)).scalar()
    assert kept is not None and trace_id_of(kept) == traces[replayed]
    assert all(dict(m.headers()).get(TRACEPARENT) for m in outcomes[swept[1]])


@pytest.mark.slow  # about 4 s: a `lapse relay` process
def test_a_role_sends_its_spans_over_otlp_and_carries_the_context_it_was_given(pipeline, otlp_receiver):
    """Tracing off in this process: schedule_cleanup carries the caller's context as it is. A
    `lapse relay` with `tracing.endpoint` set relays the event with it and sends its span there."""
    settings = pipeline.settings
    with pipeline.engine.begin() as conn:
        schedule_cleanup(conn, "release-reservation", 7, "t1", database_now(conn), settings=settings,
                         traceparent=APP)
        headers = conn.execute(select(outbox.c.headers)).scalar()
    assert headers[TRACEPARENT] == APP

    (done,) = run_lapse(["relay", "--exit-when-idle", "1"], cwd=REPO_ROOT, env=role_env(settings, **{
        "tracing.endpoint": otlp_receiver.url + "/v1/traces", "tracing.service_name": "relay-under-test"}))
    assert done.code == 0, done.stderr[-10:]
    (record,) = read_topic(settings.kafka.bootstrap_servers, settings.topology.expiry)
    assert traceparent_in(record.headers()) == APP
    sent = b"".join(otlp_receiver.bodies)
    assert RELAY.encode() in sent and b"relay-under-test" in sent and bytes.fromhex(trace_id_of(APP)) in sent
