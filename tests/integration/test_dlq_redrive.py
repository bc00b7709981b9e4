"""Poison redrive on Apache Kafka and PostgreSQL (`lapse dlq redrive`): poison written with a writer
schema the readers lacked is sent again once the schema is added, under one redrive id and an
operator action, and applied once; what still fails stays with its new reason; a second redrive,
even after the ledger row is gone, sends nothing; a selector matching nothing is one line, exit 2."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from io import BytesIO

import fastavro
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from sqlalchemy import delete, func, select

from lapse.devtools.demo_tables import reservations
from lapse.kernel import ledger
from lapse.kernel.codec import Codec, schema_fingerprint
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.models import cleanup_ledger, ledger_transitions, operator_actions, outbox
from lapse.kernel.settings import env_var
from lapse.producers import relay_until_empty
from lapse.shell.app import main
from lapse.shell.error_boundary import ExitCode
from tests.fixtures.kafka import read_topic
from tests.fixtures.pipeline import PAST, connection_env, expiry_event, seed
from tests.fixtures.workers import process_until_done

pytestmark = pytest.mark.slow
REDRIVE = ["dlq", "redrive", "--limit", "10", "--reason", "schema with priority added", "--actor", "alice"]


def newer_expiry_schema(schemas) -> dict:
    """The expiry event with one more field, as a producer a release ahead of the readers writes it."""
    schema = json.loads((schemas / "expiry_event.avsc").read_text())
    schema["fields"].append({"name": "priority", "type": ["null", "string"], "default": None,
                             "doc": "How urgent the cleanup is (a field the readers do not know yet)."})
    return schema


def written_with(schema: dict, event: ledger.ExpiryEvent, **tampered: object) -> bytes:
    """`event` in Avro single-object encoding under `schema`, `tampered` fields overwritten."""
    body = BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema, named_schemas={}),
                               {**ledger.expiry_record(event, datetime.now(UTC)), "priority": "high", **tampered})
    return b"\xc3\x01" + schema_fingerprint(schema) + body.getvalue()


def test_poison_of_an_unknown_writer_schema_is_redriven_once_after_the_schema_is_added(pipeline, tmp_path):
    schemas = tmp_path / "schemas"
    shutil.copytree(pipeline.settings.schemas.dir, schemas)
    settings = pipeline.settings.with_(schemas={"dir": schemas})
    env = {**connection_env(settings), env_var("schemas.dir"): str(schemas)}
    newer = newer_expiry_schema(schemas)
    (rid,) = seed(pipeline, 1)
    good = expiry_event(rid)
    too_long = ledger.expiry_event("release-reservation", 5, "t1", PAST, source="app", correlation_id="c-5")
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for key, value in ((good.op_key, written_with(newer, good)),
                       (too_long.op_key, written_with(newer, too_long, tenant="t" * 65)),
                       ("garbage", b"not avro at all")):
        producer.produce(settings.topology.expiry, key=key.encode(), value=value, partition=0)
    assert producer.flush(10) == 0
    assert process_until_done(settings).poison == 3
    assert _ledger_states(pipeline) == {}

    # Before the schema is there, nothing decodes.
    before = _redrive(env, "--all", "--dry-run", "--json")
    assert before["sendable"] == [] and _codes(before) == {"unknown_fingerprint": 2, "bad_magic": 1}

    # The schema added to the readers' history: the good one decodes now, the other one fails anew.
    (schemas / "history" / "expiry_event.v2-priority.avsc").write_text(json.dumps(newer))
    dry = _redrive(env, "--all", "--dry-run", "--json")
    assert [e["op_key"] for e in dry["sendable"]] == [good.op_key]
    assert _codes(dry) == {"invalid_field": 1, "bad_magic": 1}
    assert _ledger_states(pipeline) == {}  # a dry run changes nothing

    done = _redrive(env, "--all", "--yes", "--json")
    redrive_id = done["redrive_id"]
    assert [e["op_key"] for e in done["sent"]] == [good.op_key] and redrive_id.startswith("redrive-")
    assert _codes(done) == {"invalid_field": 1, "bad_magic": 1}  # still failing, with the new reason
    with pipeline.engine.connect() as conn:
        (action,) = conn.execute(select(operator_actions)).mappings()
        row = conn.execute(select(cleanup_ledger).where(cleanup_ledger.c.op_key == good.op_key)).mappings().one()
    assert (action["action"], action["actor"], action["target"]) == ("dlq_redrive", "alice", "all poison")
    assert action["details"]["redrive_id"] == redrive_id and action["details"]["op_keys"] == [good.op_key]
    assert (row["state"], row["replay_id"], row["source"]) == ("pending", redrive_id, "redrive")

    engine = make_engine(settings.database.url_plain())
    relay_until_empty(engine, make_producer(settings), Codec.from_settings(settings), 100)
    engine.dispose()
    process_until_done(settings, terminal=1)
    assert _ledger_states(pipeline) == {"applied": 1}
    with pipeline.engine.connect() as conn:
        applied = conn.execute(select(func.count()).where(ledger_transitions.c.op_key == good.op_key,
                                                          ledger_transitions.c.to_state == "applied")).scalar()
        status = conn.execute(select(reservations.c.status).where(reservations.c.id == rid)).scalar()
    assert (applied, status) == (1, "released")

    # Again: nothing sent twice; nor once the ledger row is gone (pruned past its horizon).
    again = _redrive(env, "--all", "--yes", "--json")
    assert again["redrive_id"] is None and again["sent"] == []
    assert [e["skipped"] for e in again["skipped"]] == [f"redriven before by {redrive_id}"]
    with pipeline.engine.begin() as conn:
        conn.execute(delete(ledger_transitions).where(ledger_transitions.c.op_key == good.op_key))
        conn.execute(delete(cleanup_ledger).where(cleanup_ledger.c.op_key == good.op_key))
    assert _redrive(env, "--reason-code", "unknown_fingerprint", "--yes", "--json")["sent"] == []
    with pipeline.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(operator_actions)).scalar() == 1
        assert conn.execute(select(func.count()).where(outbox.c.topic == settings.topology.expiry,
                                                       outbox.c.key == good.op_key)).scalar() == 1
    assert len(read_topic(settings.kafka.bootstrap_servers, settings.topology.dlq)) == 3  # the poison stays

    # A selector that matches nothing: one line, exit 2.
    for selector in (["--offset", "0:999"], ["--reason-code", "no_such_code"]):
        nothing = CliRunner().invoke(main, [*REDRIVE, *selector, "--yes"], env=env)
        assert nothing.exit_code == ExitCode.USAGE, nothing.output
        assert nothing.output.startswith("lapse: no poison dead letter on ") and nothing.output.count("\n") == 1


def _redrive(env: dict[str, str], *args: str) -> dict:
    result = CliRunner().invoke(main, [*REDRIVE, *args], env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _codes(result: dict) -> dict[str, int]:
    codes: dict[str, int] = {}
    for entry in result["fails"]:
        codes[entry["code"]] = codes.get(entry["code"], 0) + 1
    return codes


def _ledger_states(pipeline) -> dict[str, int]:
    with pipeline.engine.connect() as conn:
        return dict(conn.execute(select(cleanup_ledger.c.state, func.count()).group_by(cleanup_ledger.c.state)).all())
